#!/usr/bin/env bash
# A bundle small enough to travel WITH the working tree to a GPU machine that already has a CUDA PyTorch image (the
# device tool's 'cuda' image: torch, pandas, pyarrow, numpy, accelerate, peft, xxhash, psutil, fsspec are there):
#   bash bench/gpu/carry.sh [OUT=.gpu/carry]          where PyPI is reachable (about 32 MB, a minute)
#   bash bench/gpu/run.sh .gpu/carry OUT_DIR [PART]   on the GPU machine (run.sh takes this folder as its BUNDLE)
# It holds wheels (not unpacked: half the bytes) of what that image lacks or has at another version than seqtune's
# pins (constraints.txt): transformers, tokenizers, peft, hydra-core, omegaconf, antlr4 runtime (built here: sdist
# only), bitsandbytes with only the CPU and CUDA_LIB libraries (default cuda130), Liger-Kernel, trl, datasets and its
# dill/multiprocess; and the Llama 3 and Qwen3 tokenizers scripts/fetch_tokenizers.py converted. bundle.sh is the
# self-contained variant for a machine with torch alone (73 MB xz, 39 min to build).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-.gpu/carry}
pyver=${PYVER:-3.12}
cuda_lib=${CUDA_LIB:-cuda130}
pin() {
  grep -iE "^$1==" constraints.txt | head -1 | grep . \
    || .venv/bin/python -c "import sys; from importlib.metadata import version; print(f'{sys.argv[1]}=={version(sys.argv[1])}')" "$1"
}
rm -rf "$out" && mkdir -p "$out/wheels"
for requirement in "$(pin transformers)" "$(pin tokenizers)" "$(pin peft)" "$(pin hydra-core)" "$(pin omegaconf)" \
                   "$(pin bitsandbytes)" "$(pin liger-kernel)" "$(pin trl)" "$(pin datasets)" "$(pin dill)" \
                   "$(pin multiprocess)"; do
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$out/wheels" "$requirement"
done
python3 -m pip wheel --quiet --no-deps -w "$out/wheels" antlr4-python3-runtime==4.9.3
# bitsandbytes ships one library per CUDA/ROCm/XPU version (43 MB zipped): keep the machine's and the CPU one.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
wheel=$(realpath "$out"/wheels/bitsandbytes-*.whl)
(cd "$work" && python3 -m zipfile -e "$wheel" . \
  && find . -name 'libbitsandbytes_*.so' ! -name "libbitsandbytes_${cuda_lib}.so" ! -name 'libbitsandbytes_cpu.so' -delete \
  && rm "$wheel" && python3 -m zipfile -c "$wheel" ./*)
# The tokenizers gzipped (39 MB of JSON -> about 9): the working tree travels under 64 MiB in all.
tar -C "${SEQTUNE_CACHE:-$HOME/.cache/seqtune}" -czf "$out/tokenizers.tar.gz" tokenizers/llama3 tokenizers/qwen3
echo "wrote $out ($(du -sh "$out" | cut -f1)); carry it: bash bench/gpu/run.sh $out OUT_DIR"
