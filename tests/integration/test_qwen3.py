"""`model=qwen3_tiny tokenizer=qwen3` end to end on chat data: the Qwen3 template's rendering is what trains, with
<|im_end|> a target of every reply, no bos anywhere, the report saying what the template does to earlier turns, and
the validation loss falling, samples generated from bos-less prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqtune.data.cache import TokenCache
from seqtune.data.types import IGNORE_INDEX
from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")


def chat(i: int) -> dict:
    return {
        "messages": [
            {"role": "system", "content": "Answer with numbers."},
            {"role": "user", "content": f"Count to {i % 7 + 1}."},
            {"role": "assistant", "content": " ".join(str(j) for j in range(1, i % 7 + 2))},
            {"role": "user", "content": "And twice that?"},
            {"role": "assistant", "content": str(2 * (i % 7 + 1))},
        ]
    }


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_qwen3_tiny_trains_chat_with_im_end_as_target_and_validation_loss_falls(tmp_path: Path):
    from transformers import AutoTokenizer

    train = write_jsonl(tmp_path / "train.jsonl", [chat(i) for i in range(48)])
    val = write_jsonl(tmp_path / "val.jsonl", [chat(i) for i in range(100, 108)])
    run_dir = tmp_path / "run"
    result = run_cli(
        [
            "model=qwen3_tiny",
            "tokenizer=qwen3",
            "data.format=chat",
            f"data.train={train}",
            f"data.val={val}",
            "data.duplicates=keep",
            "train.max_steps=24",
            "train.eval_every=8",
            "train.batch_size=8",
            "train.eval_samples=2",
        ],
        run_dir,
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    assert "chat template qwen3: every assistant turn keeps its <think> block" in " ".join(text.split())
    losses = [m["eval_loss"] for m in read_metrics(run_dir) if "eval_loss" in m]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2], losses
    # Generated samples from bos-less prompts: each prompt is the rendering up to the first reply.
    generated = [json.loads(line) for line in (run_dir / "samples_generated.jsonl").read_text().splitlines()]
    assert len(generated) == 6 and all(g["prompt"].startswith("<|im_start|>system\n") for g in generated)
    assert all(g["prompt"].endswith("<|im_start|>assistant\n") for g in generated)
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "adapter")
    sample = TokenCache.open(Path(json.loads((run_dir / "preflight.json").read_text())["caches"]["train"]))[0]
    assert tokenizer.decode(sample.input_ids).startswith("<|im_start|>system\nAnswer with numbers.<|im_end|>\n")
    targets = sample.input_ids[sample.labels != IGNORE_INDEX].tolist()
    assert targets.count(tokenizer.convert_tokens_to_ids("<|im_end|>")) == 2  # both replies end on a trained marker
    assert tokenizer.decode(targets).startswith("<think>\n\n</think>\n\n1")


def reasoning_chat(i: int) -> dict:
    n = i % 7 + 1
    reply = f"<think>\n{n} plus {n} is {2 * n}.\n</think>\n\n{2 * n}" if i % 3 else str(2 * n)  # some without
    return {"messages": [{"role": "user", "content": f"What is {n}+{n}?"}, {"role": "assistant", "content": reply}]}


@pytest.mark.parametrize("train_on_reasoning", [True, False])
def test_qwen3_tiny_trains_think_blocks_written_in_content(tmp_path: Path, train_on_reasoning: bool):
    """Issue 30 item 5: <think>...</think> at the start of a reply was refused on every line as special-token text;
    it is the qwen3 template's reasoning block, rendered and trained (or masked with data.train_on_reasoning=false)."""
    from transformers import AutoTokenizer

    train = write_jsonl(tmp_path / "train.jsonl", [reasoning_chat(i) for i in range(24)])
    run_dir = tmp_path / "run"
    result = run_cli(
        [
            "model=qwen3_tiny",
            "tokenizer=qwen3",
            "data.format=chat",
            f"data.train={train}",
            f"data.train_on_reasoning={str(train_on_reasoning).lower()}",
            "data.duplicates=keep",
            "train.max_steps=3",
            "train.batch_size=8",
        ],
        run_dir,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "adapter")
    cache = TokenCache.open(Path(json.loads((run_dir / "preflight.json").read_text())["caches"]["train"]))
    sample = cache[1]  # line 2: a reply with its reasoning
    assert tokenizer.decode(sample.input_ids).endswith(
        "<|im_start|>assistant\n<think>\n2 plus 2 is 4.\n</think>\n\n4<|im_end|>\n"
    )
    targets = tokenizer.decode(sample.input_ids[sample.labels != IGNORE_INDEX])
    assert targets == ("<think>\n2 plus 2 is 4.\n</think>\n\n4<|im_end|>" if train_on_reasoning else "4<|im_end|>")
