#!/usr/bin/env bash
# The whole GPU programme in one command (bench/gpu/README.md):
#   bash bench/gpu/run.sh BUNDLE OUT_DIR [PART ...]      on the GPU machine (torch and transformers' own dependencies
#                                                        installed; the bundle from bench/gpu/bundle.sh carries the
#                                                        rest, so nothing is fetched there)
#   bash bench/gpu/run.sh --dry-run OUT_DIR [PART ...]   on any CPU, in this checkout's environment (.venv with the dev
#                                                        extra): every part with --device cpu on tiny shapes
# PARTs (default: all but after_training on a GPU, all of them in a dry run), each under `timeout 570` on the GPU (so a
# failing or slow part leaves the others' results and any one part fits a 10-minute device call; 3000 s in a dry run,
# which has no such limit and shares its cores):
#   proof          bench/gpu/proof.py: contamination, QLoRA / bf16 LoRA / full steps, 8B-shape throughput vs the
#                  unpacked Trainer, the Qwen3-8B shape, preflight's memory estimate vs measured peaks, torchrun (NCCL)
#   vs_trl_sft     bench/gpu/vs_trl.py --only sft: the 8B-shape LoRA row vs TRL's SFTTrainer, 8,192 positions/step
#   vs_trl_dpo     bench/gpu/vs_trl.py --only dpo,grpo: DPO vs DPOTrainer; the GRPO placeholder
#   resume_check   bench/gpu/resume_check.py: exact resume on the device
#   lora_step      bench/gpu/lora_step.py: where a LoRA step's time goes (the kernel profile)
#   grpo           bench/grpo_vs_trl.py --shape tinyllama_1b: recipe=lora_grpo vs TRL's GRPOTrainer on the device
#                  (both sampling with their own generate loop; vLLM is not on the machine), loss parity
#   grpo_c128      the same with --completion-tokens 128: issue 39's row, 8 prompts x 8 completions = 64 completions
#                  of up to 128 tokens per step (the random-weight model seldom stops early), where the per-token draw
#                  (seqtune.rollout.draw: on the device, no host copy) is what the sampler's speed rests on
#   after_training bench/gpu/after_training.py: DoRA memory, generation and early stopping on the device
#   big_models     bench/gpu/big_models.py: issue 42's rows, named only (in neither default set): the 8B shape at
#                  32k tokens without/with model.activation_offload, LoRA over an FP8 block-scaled 8B checkpoint vs
#                  bf16 (peaks, step time, the estimate's error)
# OUT_DIR gets each part's JSON (device, versions, command, every repeat) and run.json (each part's exit code and
# seconds); copy the JSON files into bench/results/ and the tables into bench/README.md.
set -uo pipefail
cd "$(dirname "$0")/../.."
declare -A argv=(
  [proof]="bench/gpu/proof.py"
  [vs_trl_sft]="bench/gpu/vs_trl.py --only sft --result gpu_vs_trl_sft.json --repeats 2"
  [vs_trl_dpo]="bench/gpu/vs_trl.py --only dpo,grpo --result gpu_vs_trl_dpo.json"
  [resume_check]="bench/gpu/resume_check.py"
  [lora_step]="bench/gpu/lora_step.py"
  [grpo]="bench/grpo_vs_trl.py --shape tinyllama_1b --steps 8 --cache-only"
  [grpo_c128]="bench/grpo_vs_trl.py --shape tinyllama_1b --steps 6 --cache-only --completion-tokens 128"
  [after_training]="bench/gpu/after_training.py"
  [big_models]="bench/gpu/big_models.py"
)
if [ "${1:-}" = "--dry-run" ]; then
  out=$2
  shift 2
  parts=("${@:-proof vs_trl_sft vs_trl_dpo resume_check lora_step after_training}")  # grpo: bench/grpo_vs_trl.py
  python=${PYTHON:-.venv/bin/python} limit=3000
  # No time budget on the CPU (the sections' budgets are for a device call); lora_step: one timed step; the DPO row:
  # two repeats, as the SFT row has (each order of the alternation once; a third repeats repeat 0's order).
  for part in proof vs_trl_sft vs_trl_dpo resume_check after_training big_models; do argv[$part]+=" --device cpu --budget-s 3000"; done
  argv[lora_step]+=" --device cpu --steps 1 --warmup 1"
  argv[vs_trl_dpo]+=" --repeats 2"
else
  bundle=$1 out=$2
  shift 2
  parts=("${@:-proof vs_trl_sft vs_trl_dpo resume_check lora_step grpo grpo_c128}")
  root=${SEQTUNE_GPU_ROOT:-/tmp/seqtune-gpu}
  mkdir -p "$root/site"
  if [ -d "$bundle" ]; then
    # bench/gpu/carry.sh's folder (wheels/ + tokenizers.tar.gz): small enough to travel with the working tree.
    for wheel in "$bundle"/wheels/*.whl; do python3 -m zipfile -e "$wheel" "$root/site" || exit 1; done
    tar -C "$root" -xzf "$bundle/tokenizers.tar.gz" || exit 1
  else
    tar -C "$root" -xJf "$bundle" || exit 1
  fi
  cache="${SEQTUNE_CACHE:-$HOME/.cache/seqtune}/tokenizers"
  mkdir -p "$cache"
  cp -r "$root/tokenizers/." "$cache/"
  export PYTHONPATH="$root/site${PYTHONPATH:+:$PYTHONPATH}"
  # seqtune itself: editable, no dependencies, no index (configs and recipes are modules of the package).
  python3 -m pip install --quiet --no-deps --no-build-isolation --no-index -e . >/dev/null || exit 1
  python=python3 limit=${PART_LIMIT:-570}
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
export PYTHONUNBUFFERED=1
mkdir -p "$out"
out=$(cd "$out" && pwd)
# "${@:-a b}" gives one word "a b" when no PART was named: split it.
read -r -a parts <<<"${parts[*]}"
for part in "${parts[@]}"; do
  if [ -z "${argv[$part]:-}" ]; then
    echo "unknown part '$part'; the parts: ${!argv[*]}" >&2
    exit 2
  fi
done
for part in "${parts[@]}"; do
  echo "=== $part: python ${argv[$part]} --out $out"
  began=$(date +%s)
  # shellcheck disable=SC2086  # the part's arguments are separate words
  timeout "$limit" "$python" ${argv[$part]} --out "$out"
  code=$?
  # run.json keeps every part's latest exit code and seconds, across calls that each run some parts.
  "$python" - "$out/run.json" "$part" "$code" "$(($(date +%s) - began))" "python ${argv[$part]} --out $out" <<'EOF'
import json, sys
from pathlib import Path

path, part, code, seconds, command = Path(sys.argv[1]), *sys.argv[2:]
record = json.loads(path.read_text()) if path.is_file() else {"parts": {}}
record["parts"][part] = {"exit": int(code), "seconds": int(seconds), "command": command}
path.write_text(json.dumps(record, indent=2) + "\n")
EOF
done
cat "$out/run.json"
