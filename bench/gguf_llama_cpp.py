"""Each family's GGUF export loaded by the real reader, llama.cpp (seqtune.llama_cpp: the prebuilt
llama-cpp-py-sync wheel of the dev extra), against transformers.

    .venv/bin/python bench/gguf_llama_cpp.py [--families llama3 qwen3 gemma3 mistral tinyllama] [--type f16]
    .venv/bin/python bench/gguf_llama_cpp.py --families qwen3_moe mixtral olmoe   # mixtures of experts (model=hf)

For each family: a tiny model trains 2 steps on chat data with its real
tokenizer (a mixture of experts: a tiny model=hf checkpoint from tests/support/checkpoints.py, by `model.path`) and exports
merged/ plus a GGUF file (`train.export_gguf`), then
- llama.cpp must load the file (what seqtune's own proof cannot show: it reads its tensors back with gguf-py);
- the prompt's token ids from llama.cpp's tokenizer equal transformers' (the chat template rendered by
  transformers, tokenized by both without adding specials again);
- the next-token logits at the prompt's last position agree (largest |difference| relative to the largest logit);
- 16 greedy tokens are the same on both sides (where they part, transformers' own margin between its top two
  tokens there: a near-tie of a random tiny model's near-uniform logits goes either way under f16 rounding).
Prints a table and writes bench/results/gguf_llama_cpp.json. A family whose file llama.cpp refuses is a row with
the reason, not a crash.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests.checkpoints, for the model=hf rows

from _common import PYTHON, REPO, markdown_table, write_results

FAMILIES = {
    # The tiny models have 4096 rows (Qwen3's has the real 151,936): a real tokenizer resizes them, as a user would.
    "llama3": ["model=llama3_tiny", "tokenizer=llama3", "model.resize_embeddings=true"],
    "qwen3": ["model=qwen3_tiny", "tokenizer=qwen3"],
    "gemma3": ["model=gemma3_tiny", "tokenizer=gemma3", "model.resize_embeddings=true"],
    "mistral": ["model=mistral_tiny", "tokenizer=mistral_v3", "model.resize_embeddings=true"],
    "tinyllama": ["model=tinyllama_tiny"],
}
# model=hf checkpoints, built by tests/support/checkpoints.py and trained by `model.path` (model.family=auto): the mixtures of
# experts whose GGUF rows live in seqtune/models/{qwen3_moe,mixtral,olmoe}.py, with the fixture's config overrides
# (OLMoE as it ships: no grouped-query attention, which llama.cpp's olmoe cannot hold).
CHECKPOINTS = {"qwen3_moe": {}, "mixtral": {}, "olmoe": {"num_key_value_heads": 4}}
GREEDY = 16


def model_args(family: str, root: Path) -> list[str]:
    """The row's model arguments: a named family's, or model.path of a freshly built model=hf checkpoint."""
    if family in FAMILIES:
        return FAMILIES[family]
    from tests.support.checkpoints import build_checkpoint

    return [f"model.path={build_checkpoint(family, root / f'{family}-checkpoint', CHECKPOINTS[family])}"]


def train(family: str, gguf_type: str, root: Path) -> Path:
    import subprocess

    data = root / "chat.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"What is {i} plus {i}?"},
                        {"role": "assistant", "content": f"It is {2 * i}."},
                    ]
                }
            )
            + "\n"
            for i in range(24)
        )
    )
    run_dir = root / family
    command = [
        PYTHON,
        "-m",
        "seqtune",
        *model_args(family, root),
        f"data.train={data}",
        "data.format=chat",
        "data.val_fraction=0.25",
        "train.max_steps=2",
        "train.export_merged=true",
        f"train.export_gguf={gguf_type}",
        "preflight.plot=false",
        "train.progress=false",
        f"hydra.run.dir={run_dir}",
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"training {family} failed: {(result.stdout + result.stderr)[-2000:]}")
    return run_dir


def compare(run_dir: Path, gguf_type: str) -> dict:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seqtune.config.errors import SeqtuneError
    from seqtune.llama_cpp import LlamaModel

    merged = run_dir / "merged"
    tokenizer = AutoTokenizer.from_pretrained(merged)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 plus 3?"}], tokenize=False, add_generation_prompt=True
    )
    hf_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    path = next((run_dir / "gguf").glob(f"*-{gguf_type}.gguf"))
    try:
        llm = LlamaModel(path, n_ctx=512)
    except SeqtuneError as exc:  # llama.cpp refusing the file is the row's result
        return {"loads": False, "error": str(exc)[:300]}
    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    # HF's min_new_tokens keeps every eos id from being picked; the same ids are masked on llama.cpp's side.
    eos = model.generation_config.eos_token_id
    masked = [eos] if isinstance(eos, int) else list(eos or [])
    with torch.no_grad():
        hf_logits = model(input_ids=torch.tensor([hf_ids])).logits[0, -1].numpy()
        hf_greedy = model.generate(
            input_ids=torch.tensor([hf_ids]), max_new_tokens=GREEDY, do_sample=False, min_new_tokens=GREEDY
        )[0, len(hf_ids) :].tolist()
    with llm:
        cpp_ids = llm.tokenize(prompt)
        cpp_logits = llm.next_logits(hf_ids)[: hf_logits.shape[0]]
        cpp_greedy: list[int] = []
        for _ in range(GREEDY):
            row = llm.next_logits(hf_ids + cpp_greedy)
            row[masked] = -np.inf
            cpp_greedy.append(int(np.argmax(row)))
    scale = max(1.0, float(np.abs(hf_logits).max()))
    return {
        "loads": True,
        "same_prompt_ids": cpp_ids == hf_ids,
        "prompt_tokens": len(hf_ids),
        "max_logit_difference_relative": float(np.abs(cpp_logits - hf_logits).max()) / scale,
        "same_top1": int(np.argmax(cpp_logits)) == int(np.argmax(hf_logits)),
        "same_greedy_tokens": cpp_greedy == hf_greedy,
        **_parting(model, hf_ids, hf_greedy, cpp_greedy, masked),
        "greedy_hf": hf_greedy,
        "greedy_llama_cpp": cpp_greedy,
    }


def _parting(model, prompt: list[int], hf: list[int], cpp: list[int], masked: list[int]) -> dict:
    """Where the greedy tokens part, and transformers' own margin between its top two tokens there: a random tiny
    model's near-uniform logits have near-ties that f16 rounding decides either way (a margin under the logits'
    f16 error is a tie, not a wrong model)."""
    import numpy as np
    import torch

    at = next((i for i, (a, b) in enumerate(zip(hf, cpp, strict=True)) if a != b), None)
    if at is None:
        return {"greedy_parts_at": None}
    with torch.no_grad():
        row = model(input_ids=torch.tensor([prompt + hf[:at]])).logits[0, -1].numpy().copy()
    row[masked] = -np.inf
    top = np.sort(row)[-2:]
    return {"greedy_parts_at": at, "hf_margin_at_parting": float(top[1] - top[0])}


def _greedy_cell(result: dict) -> str:
    if not result.get("loads"):
        return "-"
    if result["same_greedy_tokens"]:
        return "yes"
    return (
        f"no (from token {result['greedy_parts_at'] + 1}; HF's top-2 margin there {result['hf_margin_at_parting']:.2g})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    rows_known = [*FAMILIES, *CHECKPOINTS]
    parser.add_argument("--families", nargs="+", choices=sorted(rows_known), default=rows_known)
    parser.add_argument("--type", choices=["f16", "bf16", "q8_0", "q4_k_m", "q5_k_m", "q6_k"], default="f16")
    args = parser.parse_args()
    from seqtune.llama_cpp import missing_reason, version

    if reason := missing_reason():
        print(f"bench/gguf_llama_cpp.py: {reason}", file=sys.stderr)
        return 2
    rows, results = [], {}
    with tempfile.TemporaryDirectory(prefix="seqtune-gguf-bench-") as tmp:
        for family in args.families:
            result = compare(train(family, args.type, Path(tmp)), args.type)
            results[family] = result
            rows.append(
                [
                    family,
                    args.type,
                    "yes" if result["loads"] else f"no: {result['error']}",
                    result.get("same_prompt_ids", "-"),
                    f"{result['max_logit_difference_relative']:.2g}" if result["loads"] else "-",
                    result.get("same_top1", "-"),
                    _greedy_cell(result),
                ]
            )
    header = [
        "family",
        "type",
        "llama.cpp loads",
        "prompt ids equal",
        "max logit diff (rel)",
        "top-1",
        "16 greedy equal",
    ]
    print(markdown_table(header, rows))
    write_results("gguf_llama_cpp", {"llama_cpp": version(), "type": args.type, "families": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
