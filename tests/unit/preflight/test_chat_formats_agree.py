"""data.format=sharegpt and data.format=chat are the same conversations rendered by the same chat template: preflight
must judge them alike (the template decides where a turn ends, plan.tokens.templated), whichever format they come in.
The template here closes each turn with <|end|>, a control token that is neither eos nor the family's end-of-turn:
only the template's own turn closer makes those turns terminated."""

from __future__ import annotations

from pathlib import Path

from test_preflight_run import make_cfg, write_jsonl

from seqtune.config.plan import load_plan
from seqtune.preflight import load_result, run_preflight

TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ '<|end|>' }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def conversation(i: int) -> list[tuple[str, str]]:
    return [
        ("user", f"What is {i} plus {i}?"),
        ("assistant", f"{i} plus {i} is {2 * i}."),
        ("user", "And times two?"),
        ("assistant", f"{i} times two is {2 * i}."),
    ]


def test_sharegpt_and_chat_give_identical_preflight_results(tmp_path: Path):
    template = tmp_path / "closer.jinja"
    template.write_text(TEMPLATE)
    speakers = {"user": "human", "assistant": "gpt"}
    chat = write_jsonl(
        tmp_path / "chat.jsonl",
        [{"messages": [{"role": r, "content": c} for r, c in conversation(i)]} for i in range(40)],
    )
    sharegpt = write_jsonl(
        tmp_path / "sharegpt.jsonl",
        [{"conversations": [{"from": speakers[r], "value": c} for r, c in conversation(i)]} for i in range(40)],
    )
    results, plans = {}, {}
    for fmt, data in (("chat", chat), ("sharegpt", sharegpt)):
        cfg = make_cfg(tmp_path, data, f"data.format={fmt}", f"tokenizer.chat_template={template}")
        assert run_preflight(cfg, tmp_path / fmt).ok, fmt
        results[fmt], plans[fmt] = load_result(tmp_path / fmt), load_plan(tmp_path / fmt)
    assert plans["chat"].tokens == plans["sharegpt"].tokens and plans["chat"].tokens.templated
    assert "<|end|>" in plans["chat"].tokens.terminators.values()
    chat_split, sharegpt_split = results["chat"].splits["train"], results["sharegpt"].splits["train"]
    assert chat_split.content == sharegpt_split.content
    assert chat_split.content.trained_terminators == {"<|end|>": 80, "</s>": 40}  # and the final eos
    assert (chat_split.lengths, chat_split.records, chat_split.rejected) == (
        sharegpt_split.lengths,
        sharegpt_split.records,
        sharegpt_split.rejected,
    )
