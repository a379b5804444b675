"""Data helpers: the real bundled tokenizer, a JSONL writer (broken lines included), a small chat task, records
with a prompt/completion boundary, the tiny vision model's image facts."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from transformers import AutoTokenizer

BUNDLED_TOKENIZER = Path(__file__).resolve().parents[2] / "seqtune/tokenizers/assets/seqtune-bpe"


def load_bundled_tokenizer():
    """A fresh copy each call: tests that mutate it (pad=eos, added tokens) must not leak into others."""
    return AutoTokenizer.from_pretrained(BUNDLED_TOKENIZER)


def write_jsonl(path: Path, rows: list) -> Path:
    """Rows are dicts (dumped as JSON) or raw bytes/str written verbatim (to make broken lines)."""
    with open(path, "wb") as f:
        for row in rows:
            if isinstance(row, bytes):
                f.write(row + b"\n")
            elif isinstance(row, str):
                f.write(row.encode() + b"\n")
            else:
                f.write(json.dumps(row).encode() + b"\n")
    return path


def write_sums_chat(path: Path, records: int = 24) -> Path:
    """`records` one-turn chat records, "What is i plus i?" answered "It is 2i.": a small task a tiny model learns
    in a few steps (the export and local-run tests train on it)."""
    path.write_text(
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
            for i in range(records)
        )
    )
    return path


def boundary_records(count: int) -> dict[str, list[dict]]:
    """`count` records per text format (alpaca, input_output, text, chat) whose completions start with "[" right
    after the prompt: a boundary that an SPM tokenizer splits apart with a `▁` piece when the completion is tokenized
    on its own (the tokens-vs-text proof's planted bug)."""
    return {
        "alpaca": [
            {"instruction": f"List {i} items.", "input": "", "output": f"[{i}, 2]\nDone."} for i in range(count)
        ],
        "input_output": [{"input": f"Q{i}: what?\n", "output": f"[{i}] answer"} for i in range(count)],
        "text": [{"text": f"[{i}] plain text\nwith lines"} for i in range(count)],
        "chat": [
            {"messages": [{"role": "user", "content": f"Hi {i}"}, {"role": "assistant", "content": f"[{i}] Hello"}]}
            for i in range(count)
        ],
    }


@functools.cache
def tiny_vision_facts():
    """The tiny Gemma 3 vision model's image facts with the image tokens' ids in the real Gemma 3 tokenizer (what
    the plan resolves for model=gemma3_vision_tiny): shared by the vision data, pair and cache tests."""
    from seqtune.config.schema import ModelConfig, TokenizerConfig
    from seqtune.models.facts import read_vision_facts
    from seqtune.models.registry import get_spec
    from seqtune.preflight.resolve import with_image_ids
    from seqtune.tokenizers.facts import token_ids

    model, tokenizer = ModelConfig(family="gemma3_vision", tiny_tokenizer="gemma3"), TokenizerConfig(source="auto")
    facts = read_vision_facts(model, get_spec("gemma3_vision"))
    assert facts is not None
    return with_image_ids(facts, token_ids(tokenizer, model, facts.image_tokens))
