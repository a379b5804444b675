#!/usr/bin/env bash
# On the GPU machine (torch, transformers' dependencies and accelerate installed; no network needed):
#   bash bench/gpu/run.sh BUNDLE OUT_DIR [proof.py options]
# Unpacks the bundle from bench/gpu/bundle.sh, installs seqtune from this checkout without touching the network,
# and runs the proof; OUT_DIR gets gpu_proof.json and gpu_proof.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=$1 out=$2
shift 2
root=${SEQTUNE_GPU_ROOT:-/tmp/seqtune-gpu}
mkdir -p "$root"
tar -C "$root" -xJf "$bundle"
cache="${SEQTUNE_CACHE:-$HOME/.cache/seqtune}/tokenizers"
mkdir -p "$cache"
cp -r "$root/tokenizers/." "$cache/"
export PYTHONPATH="$root/site${PYTHONPATH:+:$PYTHONPATH}"
# seqtune itself: editable, no dependencies, no index (configs and recipes are modules of the package).
python3 -m pip install --quiet --no-deps --no-build-isolation --no-index -e . >/dev/null
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 bench/gpu/proof.py --out "$out" "$@"
