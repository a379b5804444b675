"""What verifying a token cache by content costs: python bench/cache_verify.py [--mb 100] [--repeats 5]

Two caches: the default run's (`python -m seqtune preflight.only=true`, the bundled demo data, into a fresh
data.cache_dir) and a synthetic one of about `--mb` MB written with TokenCacheWriter (random ids, 400-token samples).
For each: the time of `cache_damage` (sizes, meta checksum and every file's CRC-32, hashed cold: the per-process
memory of verified files cleared), and the time of candidate full-content hashes over the same files (read in 8 MiB
blocks from the page cache, as cache_damage reads them). Best of `--repeats`; the ratio to crc32 is what to read on a
shared machine.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from _common import PYTHON, REPO, markdown_table, write_results

from seqtune.data import cache as cache_module
from seqtune.data.cache import META, TokenCacheWriter, cache_damage
from seqtune.data.tokenize import EncodedBatch


def _crc(update: Callable[[bytes, int], int]) -> Callable[[Path], object]:
    def run(path: Path) -> object:
        value = 0
        with open(path, "rb") as f:
            while block := f.read(1 << 23):
                value = update(block, value)
        return value

    return run


def _digest(make: Callable[[], object]) -> Callable[[Path], object]:
    def run(path: Path) -> object:
        digest = make()
        with open(path, "rb") as f:
            while block := f.read(1 << 23):
                digest.update(block)  # type: ignore[attr-defined]
        return digest.hexdigest()  # type: ignore[attr-defined]

    return run


HASHES: dict[str, Callable[[Path], object]] = {
    "crc32": _crc(zlib.crc32),
    "adler32": _crc(zlib.adler32),
    "sha256": _digest(hashlib.sha256),
    "blake2b": _digest(hashlib.blake2b),
    "sha1": _digest(hashlib.sha1),
}


def default_run_cache(workdir: Path) -> Path:
    """The train split's cache of the default run's preflight (the largest of its splits)."""
    cache = workdir / "default-cache"
    subprocess.run(
        [PYTHON, "-m", "seqtune", "preflight.only=true", f"data.cache_dir={cache}", f"hydra.run.dir={workdir / 'run'}"],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    entries = [p for p in cache.iterdir() if (p / META).is_file()]
    return max(entries, key=lambda p: sum(f.stat().st_size for f in p.iterdir()))


def synthetic_cache(workdir: Path, megabytes: int) -> Path:
    """~`megabytes` MB of cache: 5 bytes per token (int32 id + uint8 target) plus ~30 bytes per 400-token sample."""
    rng = np.random.default_rng(0)
    samples_per_batch, length = 2048, 400
    batches = max(1, megabytes * 2**20 // (samples_per_batch * (5 * length + 28)))
    writer = TokenCacheWriter(workdir / "synthetic-cache", "synthetic", [Path("synthetic.jsonl")])
    for b in range(batches):
        lengths = np.full(samples_per_batch, length, dtype=np.int64)
        ids = rng.integers(0, 32000, size=int(lengths.sum()), dtype=np.int64)
        writer.append(
            EncodedBatch(
                ids=ids,
                target=rng.random(ids.size) < 0.6,
                lengths=lengths,
                files=["synthetic.jsonl"] * samples_per_batch,
                lines=np.arange(b * samples_per_batch, (b + 1) * samples_per_batch, dtype=np.int64) + 1,
                padding_stripped=np.zeros(samples_per_batch, np.int64),
                source_index=np.arange(samples_per_batch, dtype=np.int64),
            )
        )
    return writer.commit({})


def best_of(repeats: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return min(times)


def measure(directory: Path, repeats: int) -> dict[str, object]:
    files = sorted(p for p in directory.iterdir() if p.name != META)
    size = sum(p.stat().st_size for p in files)

    def verify() -> None:
        cache_module._CRCS.clear()  # cold: what a fresh process pays
        assert cache_damage(directory) is None

    row: dict[str, object] = {"bytes": size, "cache_damage_s": best_of(repeats, verify)}
    for name, run in HASHES.items():
        row[f"{name}_s"] = best_of(repeats, lambda run=run: [run(p) for p in files])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        caches = {"default run (train split)": default_run_cache(Path(tmp)), f"synthetic ~{args.mb} MB": None}
        caches[f"synthetic ~{args.mb} MB"] = synthetic_cache(Path(tmp), args.mb)
        results = {name: measure(path, args.repeats) for name, path in caches.items() if path is not None}
    header = ["cache", "size", "cache_damage", *(f"{h}" for h in HASHES), "sha256 / crc32"]
    rows = [
        [
            name,
            f"{r['bytes'] / 2**20:.2f} MiB",
            f"{r['cache_damage_s'] * 1e3:.1f} ms",
            *(f"{r[f'{h}_s'] * 1e3:.1f} ms" for h in HASHES),
            f"{r['sha256_s'] / r['crc32_s']:.1f}x",
        ]
        for name, r in results.items()
    ]
    print(markdown_table(header, rows))
    write_results("cache_verify", {"args": vars(args), "results": results})


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
