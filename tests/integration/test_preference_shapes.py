"""Public preference data read as it is published, through the real CLI (recipe=lora_dpo on a tiny model): a
LLaMA-Factory dpo_en_demo.json-shaped file and Alpaca pairs train with no converter, an Alpaca pair's input is
never dropped, data.overlength=drop counts pairs, and a pair that repeats its prompt is refused before step 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqtune.preflight.samples import SAMPLES_JSON
from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow

COMMON = [
    "recipe=lora_dpo",
    "train.max_steps=2",
    "train.batch_size=4",
    "train.log_every=1",
    "train.eval_every=0",
    "preflight.plot=false",
    "data.val=null",
]
TOPICS = ("tides", "rainbows", "thunder", "seasons", "eclipses", "volcanoes", "glaciers", "deserts")


def demo_pair(i: int) -> dict:
    """One record as LLaMA-Factory's data/dpo_en_demo.json has them (formatting: sharegpt, ranking: true)."""
    topic = TOPICS[i % len(TOPICS)]
    return {
        "conversations": [{"from": "human", "value": f"Explain {topic} to a child in two sentences ({i})."}],
        "chosen": {"from": "gpt", "value": f"{topic.capitalize()} happen because nature moves. It is fun to watch."},
        "rejected": {"from": "gpt", "value": f"I cannot explain {topic}."},
    }


def alpaca_pair(i: int) -> dict:
    """LLaMA-Factory's Alpaca pairs: every third record has an input."""
    topic = TOPICS[i % len(TOPICS)]
    return {
        "instruction": f"Write one sentence about {topic} ({i}).",
        "input": f"Mention the colour blue {i} times." if i % 3 == 0 else "",
        "chosen": f"{topic.capitalize()} can be blue and bright.",
        "rejected": "No.",
    }


def text(result) -> str:
    return " ".join((result.stdout + result.stderr).split())


def ok(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def refused(result) -> str:
    assert result.returncode == 2 and "Traceback" not in result.stderr, text(result)[-3000:]
    return text(result)


def test_a_dpo_en_demo_shaped_file_trains_with_no_converter(tmp_path):
    demo = tmp_path / "dpo_en_demo.json"
    demo.write_text(json.dumps([demo_pair(i) for i in range(16)], indent=2))  # pretty-printed, as published
    run_dir = tmp_path / "run"
    ok(run_cli([*COMMON, f"data.train={demo}", "data.format=preference", "preflight.show=1"], run_dir))
    assert [m["step"] for m in read_metrics(run_dir) if "rewards/accuracies" in m] == [1, 2]
    assert "ShareGPT {conversations} and OpenAI {messages} pairs with the chat template" in text(
        run_cli([*COMMON, f"data.train={demo}", "preflight.only=true"], tmp_path / "again")
    )
    [shown] = json.loads((run_dir / SAMPLES_JSON).read_text())[:1]
    # The question is rendered once per sequence, by the template (zephyr's <|user|> turn), and is no target.
    question = demo_pair(0)["conversations"][0]["value"].split(" (")[0]
    assert shown["text"].count("Explain") == 1 and question.split()[0] in shown["text"]


def test_alpaca_pairs_train_with_their_input_and_a_prompt_mapping_that_drops_it_is_refused(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(alpaca_pair(i)) + "\n" for i in range(16)))
    run_dir = tmp_path / "run"
    ok(run_cli([*COMMON, f"data.train={pairs}", "preflight.show=4"], run_dir))
    assert [m["step"] for m in read_metrics(run_dir) if "rewards/accuracies" in m] == [1, 2]
    shown = json.loads((run_dir / SAMPLES_JSON).read_text())
    assert any("### Input:\nMention the colour blue" in s["text"] for s in shown), [s["text"] for s in shown]
    # The old workaround: the instruction mapped as a string prompt keeps no input and no template.
    mapped = refused(
        run_cli(
            [*COMMON, f"data.train={pairs}", "data.columns={prompt: instruction}", "preflight.only=true"],
            tmp_path / "mapped",
        )
    )
    assert "6 of 16 train lines are malformed" in mapped and "unread_field x6" in mapped, mapped[-3000:]
    assert f"{pairs}:1 (unread_field: input holds part of the prompt" in mapped
    assert "remove data.columns.prompt" in mapped


def test_overlength_drop_counts_pairs_and_says_what_a_split_keeps(tmp_path):
    short = {"prompt": "Colour?\n", "chosen": "blue", "rejected": "no"}
    long = " ".join(["blue green red"] * 60)
    rows = [dict(short, chosen=f"blue {i}") for i in range(12)]
    val = [dict(short, chosen=f"green {i}") for i in range(9)]
    for i in range(4):  # both sequences over the limit: one pair, two sequences
        val[i] = dict(short, chosen=f"{long} {i}", rejected=f"{long} no {i}")
    for i in range(4, 6):  # only the chosen one over
        val[i] = dict(short, chosen=f"{long} {i}")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in val))
    args = [
        *COMMON[:-1],
        f"data.train={tmp_path / 'train.jsonl'}",
        f"data.val={tmp_path / 'val.jsonl'}",
        "data.max_seq_len=64",
        "preflight.only=true",
    ]
    result = run_cli([*args, "data.overlength=drop"], tmp_path / "run")
    ok(result)
    said = text(result)
    assert "6 val pair(s) with a sequence longer than 64 tokens will be dropped, leaving 3 of 9" in said, said[-3000:]
    stats = json.loads((tmp_path / "run" / "preflight.json").read_text())["splits"]["val"]
    assert stats["dropped"] == 6 and stats["over_limit"] == 6
    # data.overlength=error names each pair once, by its line.
    said = refused(run_cli([*args, "data.overlength=error"], tmp_path / "error"))
    assert "6 val pair(s) over the limit" in said and said.count("val.jsonl:1 (") == 1, said[-3000:]


def test_a_pair_that_repeats_its_explicit_prompt_is_refused_naming_its_line(tmp_path):
    question = [{"role": "user", "content": "Which colour is the sky?"}]
    good = [
        {
            "prompt": question,
            "chosen": [{"role": "assistant", "content": f"Blue ({i})."}],
            "rejected": [{"role": "assistant", "content": "Green."}],
        }
        for i in range(8)
    ]
    repeated = {  # the whole conversation as chosen and rejected, the prompt's user turn included
        "prompt": question,
        "chosen": [*question, {"role": "assistant", "content": "Blue."}],
        "rejected": [*question, {"role": "assistant", "content": "Green."}],
    }
    bad = tmp_path / "pairs.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in [*good[:3], repeated, *good[3:]]))
    said = refused(run_cli([*COMMON, f"data.train={bad}", "preflight.only=true"], tmp_path / "run"))
    assert f"{bad}:4 (repeated_prompt: chosen starts with the prompt messages again" in said, said[-3000:]
    assert "keep only the reply in chosen, or leave `prompt` out" in said
    assert Path(tmp_path / "run" / "rejects.jsonl").exists()
