"""Each family's GGUF export loaded by the real reader, llama.cpp (through llama-cpp-python), against transformers.

    .venv/bin/python -m pip install llama-cpp-python==0.3.36   # builds llama.cpp from source: tens of minutes, a C++ compiler
    .venv/bin/python bench/gguf_llama_cpp.py [--families llama3 qwen3 gemma3 mistral tinyllama] [--type f16]
    .venv/bin/python bench/gguf_llama_cpp.py --families qwen3_moe mixtral olmoe   # mixtures of experts (model=hf)

Not part of CI (the build takes long). For each family: a tiny model trains 2 steps on chat data with its real
tokenizer (a mixture of experts: a tiny model=hf checkpoint from tests/checkpoints.py, by `model.path`) and exports
merged/ plus a GGUF file (`train.export_gguf`), then
- llama.cpp must load the file (what seqtune's own proof cannot show: it reads its tensors back with gguf-py);
- the prompt's token ids from llama.cpp's tokenizer equal transformers' (the chat template rendered by
  transformers, tokenized by both without adding specials again);
- the next-token logits at the prompt's last position agree (largest |difference| relative to the largest logit);
- 16 greedy tokens are the same on both sides.
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
# model=hf checkpoints, built by tests/checkpoints.py and trained by `model.path` (model.family=auto): the mixtures of
# experts whose GGUF rows live in seqtune/models/{qwen3_moe,mixtral,olmoe}.py, with the fixture's config overrides
# (OLMoE as it ships: no grouped-query attention, which llama.cpp's olmoe cannot hold).
CHECKPOINTS = {"qwen3_moe": {}, "mixtral": {}, "olmoe": {"num_key_value_heads": 4}}
GREEDY = 16


def model_args(family: str, root: Path) -> list[str]:
    """The row's model arguments: a named family's, or model.path of a freshly built model=hf checkpoint."""
    if family in FAMILIES:
        return FAMILIES[family]
    from tests.checkpoints import build_checkpoint

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
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    merged = run_dir / "merged"
    tokenizer = AutoTokenizer.from_pretrained(merged)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 plus 3?"}], tokenize=False, add_generation_prompt=True
    )
    hf_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    path = next((run_dir / "gguf").glob(f"*-{gguf_type}.gguf"))
    try:
        llm = Llama(model_path=str(path), n_ctx=512, logits_all=True, verbose=False, seed=0)
    except Exception as exc:  # noqa: BLE001  # llama.cpp refusing the file is the row's result
        return {"loads": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    cpp_ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
    model = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    with torch.no_grad():
        hf_logits = model(input_ids=torch.tensor([hf_ids])).logits[0, -1].numpy()
        hf_greedy = model.generate(
            input_ids=torch.tensor([hf_ids]), max_new_tokens=GREEDY, do_sample=False, min_new_tokens=GREEDY
        )[0, len(hf_ids) :].tolist()
    llm.reset()
    llm.eval(hf_ids)
    cpp_logits = np.asarray(llm.scores[len(hf_ids) - 1], dtype=np.float32)[: hf_logits.shape[0]]
    # HF's min_new_tokens keeps every eos id from being picked; the same ids are masked on llama.cpp's side.
    eos = model.generation_config.eos_token_id
    masked = [eos] if isinstance(eos, int) else list(eos or [])
    cpp_greedy = []
    for _ in range(GREEDY):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        row[masked] = -np.inf
        token = int(np.argmax(row))
        cpp_greedy.append(token)
        llm.eval([token])
    scale = max(1.0, float(np.abs(hf_logits).max()))
    return {
        "loads": True,
        "same_prompt_ids": cpp_ids == hf_ids,
        "prompt_tokens": len(hf_ids),
        "max_logit_difference_relative": float(np.abs(cpp_logits - hf_logits).max()) / scale,
        "same_top1": int(np.argmax(cpp_logits)) == int(np.argmax(hf_logits)),
        "same_greedy_tokens": cpp_greedy == hf_greedy,
        "greedy_hf": hf_greedy,
        "greedy_llama_cpp": cpp_greedy,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    rows_known = [*FAMILIES, *CHECKPOINTS]
    parser.add_argument("--families", nargs="+", choices=sorted(rows_known), default=rows_known)
    parser.add_argument("--type", choices=["f16", "bf16", "q8_0"], default="f16")
    args = parser.parse_args()
    try:
        import llama_cpp
    except ImportError:
        print(
            "bench/gguf_llama_cpp.py needs llama-cpp-python (not a seqtune dependency): "
            ".venv/bin/python -m pip install llama-cpp-python==0.3.36",
            file=sys.stderr,
        )
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
                    result.get("same_greedy_tokens", "-"),
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
    write_results("gguf_llama_cpp", {"llama_cpp_python": llama_cpp.__version__, "type": args.type, "families": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
