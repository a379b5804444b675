#!/usr/bin/env bash
# Packs what bench/gpu/run.sh needs beyond torch + transformers' own dependencies into ONE file, for a GPU
# machine without network: bash bench/gpu/bundle.sh [OUT=.gpu/bundle.tar.xz]
#
# Run it where PyPI is reachable. The bundle holds seqtune's pinned pure-Python dependencies (constraints.txt),
# bitsandbytes (QLoRA) with only the CUDA library the GPU machine needs, Liger-Kernel (fused loss), the TRL
# baselines' packages (trl, accelerate, datasets and what they import that a CUDA PyTorch image lacks: pyarrow,
# pandas, numpy >= 2 for pandas 3, dill, multiprocess, xxhash, psutil, fsspec), optionally a flash-attn wheel, and
# the Llama 3 and Qwen3 tokenizers that scripts/fetch_tokenizers.py converted. bench/gpu/run.sh unpacks and uses it.
# Versions: constraints.txt's pin, else the version installed in this checkout's .venv (the set the CPU dry run,
# bash bench/gpu/run.sh --dry-run, tested). Environment: PYVER (the GPU machine's Python, default 3.12), CUDA_LIB
# (bitsandbytes library suffix to keep, default cuda130 for CUDA 13.0; `nvidia-smi` there says which CUDA the driver
# runs), FLASH_ATTN_WHEEL (a flash-attn wheel built for that machine's torch/CUDA/Python: PyPI has only its sdist,
# a build takes tens of minutes; without it TRL's baseline runs sdpa and says so in its JSON).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-.gpu/bundle.tar.xz}
pyver=${PYVER:-3.12}
cuda_lib=${CUDA_LIB:-cuda130}
pin() {
  grep -iE "^$1==" constraints.txt | head -1 | grep . \
    || .venv/bin/python -c "import sys; from importlib.metadata import version; print(f'{sys.argv[1]}=={version(sys.argv[1])}')" "$1"
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
download=(python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyver"
          --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$work/wheels")
for requirement in "$(pin transformers)" "$(pin peft)" "$(pin hydra-core)" "$(pin omegaconf)" \
                   "$(pin bitsandbytes)" "$(pin liger-kernel)" "zstandard==0.25.0" \
                   "$(pin trl)" "$(pin accelerate)" "$(pin datasets)" "$(pin pyarrow)" "$(pin pandas)" "$(pin numpy)" \
                   "$(pin python-dateutil)" "$(pin six)" "$(pin dill)" "$(pin multiprocess)" "$(pin xxhash)" \
                   "$(pin psutil)" "$(pin fsspec)"; do
  "${download[@]}" "$requirement"
done
if [ -n "${FLASH_ATTN_WHEEL:-}" ]; then cp "$FLASH_ATTN_WHEEL" "$work/wheels/"; fi
# antlr4-python3-runtime (omegaconf's parser) is published as an sdist only: build its pure-Python wheel here.
python3 -m pip wheel --quiet --no-deps -w "$work/wheels" antlr4-python3-runtime==4.9.3
mkdir -p "$work/bundle/site" "$work/bundle/tokenizers"
for wheel in "$work"/wheels/*.whl; do
  python3 -m zipfile -e "$wheel" "$work/bundle/site"
done
# bitsandbytes ships one library per CUDA/ROCm version (~130 MB); keep the machine's and the CPU one.
find "$work/bundle/site/bitsandbytes" -name 'libbitsandbytes_*.so' ! -name "libbitsandbytes_${cuda_lib}.so" \
     ! -name 'libbitsandbytes_cpu.so' -delete
for name in llama3 qwen3; do cp -r "${SEQTUNE_CACHE:-$HOME/.cache/seqtune}/tokenizers/$name" "$work/bundle/tokenizers/"; done
mkdir -p "$(dirname "$out")"
tar -C "$work/bundle" -cJf "$out" site tokenizers
echo "wrote $out ($(du -h "$out" | cut -f1)); carry it with the repo, then: bash bench/gpu/run.sh $out OUT_DIR"
