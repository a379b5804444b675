"""Through the real CLI, on tiny models and data made here: each family's real chat template (Gemma 3's, tool turns
where a format has them), and a report that is right and short (grouped problems, one table, preflight.json agreeing
with the console, exit 2 for refusals, seqtune.log, no false-alarm warnings, an adapter that says what it learned).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqtune.data.cache import TokenCache
from seqtune.data.types import IGNORE_INDEX
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

TRAIN_BRIEFLY = ["train.max_steps=2", "train.eval_every=0", "train.log_every=1", "train.batch_size=4"]
# Library noise a user cannot act on (issue 18): none of it reaches the console of a resized, checkpointed LoRA run.
FALSE_ALARMS = (
    "tie_word_embeddings",
    "is_gradient_checkpointing",
    "gradient_checkpointing_enable",
    "Skipping import of cpp extensions",
    "mean_resizing",
    "Loading weights",
    "Writing model shards",
    "\r",
)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def chat(i: int) -> dict:
    return {
        "messages": [
            {"role": "system", "content": "Answer with numbers."},
            {"role": "user", "content": f"Count to {i % 7 + 1}."},
            {"role": "assistant", "content": " ".join(str(k) for k in range(1, i % 7 + 2))},
        ]
    }


def tool_chat(i: int) -> dict:
    function = {"name": "get_weather", "arguments": {"city": f"c{i}"}}
    call = {"id": f"call{i:05d}", "type": "function", "function": function}
    return {
        "messages": [
            {"role": "user", "content": f"Weather in c{i}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": f"{i}C", "tool_call_id": call["id"]},
            {"role": "assistant", "content": f"It is {i}C in c{i}."},
        ]
    }


def output(result) -> str:
    return result.stdout + result.stderr


def ok(result) -> None:
    assert result.returncode == 0, output(result)[-4000:]


def refused(result, run_dir: Path, *needles: str) -> str:
    text = output(result)
    assert result.returncode == 2, text[-4000:]
    flat = " ".join(text.split())  # the problem table wraps its messages
    for needle in needles:
        assert needle in flat, f"{needle!r} not in:\n{text[-4000:]}"
    assert not (run_dir / "adapter").exists()
    return text


def test_gemma3_chat_renders_masks_and_trains_with_the_gemma3_template(tmp_path: Path):
    data = write_jsonl(tmp_path / "chat.jsonl", [chat(i) for i in range(24)])
    run_dir = tmp_path / "run"
    ok(
        run_cli(
            [
                "model=gemma3_tiny",
                "tokenizer=gemma3",
                "data.format=chat",
                f"data.train={data}",
                "data.val=null",
                "data.duplicates=keep",
                "model.resize_embeddings=true",
                *TRAIN_BRIEFLY,
            ],
            run_dir,
        )
    )
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(run_dir / "adapter")
    assert "<start_of_turn>" in saved.chat_template and "raise_exception" in saved.chat_template  # the official one
    report = json.loads((run_dir / "preflight.json").read_text())
    sample = TokenCache.open(Path(report["caches"]["train"]))[0]
    assert saved.decode(sample.input_ids).startswith("<bos><start_of_turn>user\nAnswer with numbers.\n\nCount to 1.")
    assert saved.decode(sample.input_ids[sample.labels != IGNORE_INDEX]) == "1<end_of_turn><eos>"


def test_tool_turns_train_where_the_format_has_them_and_are_refused_naming_the_template(tmp_path: Path):
    data = write_jsonl(tmp_path / "tools.jsonl", [tool_chat(i) for i in range(16)])
    common = ["data.format=chat", f"data.train={data}", "data.val=null", "model.resize_embeddings=true"]
    run_dir = tmp_path / "mistral"
    ok(run_cli(["model=mistral_tiny", "tokenizer=mistral_v3", *common, *TRAIN_BRIEFLY], run_dir))
    report = json.loads((run_dir / "preflight.json").read_text())
    assert report["splits"]["train"]["records"] == 16 and report["splits"]["train"]["rejected"] == 0
    failing = tmp_path / "gemma"
    text = refused(
        run_cli(["model=gemma3_tiny", "tokenizer=gemma3", *common, "preflight.only=true"], failing),
        failing,
        "[template] tokenizer.chat_template",
        "messages[2] role 'tool' is not accepted by the chat template",
        "Fix: tokenizer.chat_template=NAME",
        "llama3, mistral_v3",
    )
    # Every record refused by the template: one problem, naming the template as what to fix (not max_bad_fraction).
    assert "all 16 were rejected, most for template_rejected (16 of 16)" in " ".join(text.split())


def test_one_cause_is_one_problem_the_table_is_printed_once_and_json_agrees(tmp_path: Path):
    # Llama 3's 128,256-token vocabulary on a 4,096-row model (256 special tokens without a row), and two samples
    # that truncation leaves without a target (dropped, in both data modes, and said so).
    rows = [{"instruction": f"Name fruit {i}.", "input": "", "output": "pear"} for i in range(12)]
    rows += [{"instruction": f"Repeat this {i}. " * 40, "input": "", "output": "ok"} for i in range(2)]
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    run_dir = tmp_path / "run"
    text = refused(
        run_cli(
            [
                "tokenizer=llama3",
                f"data.train={data}",
                "data.val=null",
                "data.max_seq_len=32",
                "data.overlength=truncate",
            ],
            run_dir,
        ),
        run_dir,
        "256 special token(s) among them",
        "2 of them keep no target after truncation and are dropped",
    )
    report = json.loads((run_dir / "preflight.json").read_text())
    # The data's ids past the embedding are the vocabulary problem again: one problem, its ids in the vocab line.
    assert [p["check"] for p in report["problems"]] == ["vocab"]
    assert report["vocab"]["max_token_id"] == 128001
    # preflight.json says what the console said: the two samples are dropped, none is left without a target.
    assert report["splits"]["train"]["dropped"] == 2 and report["splits"]["train"]["zero_target"] == 0
    assert text.count("preflight: 1 problem(s)\n") == 1  # the table, once
    assert len(text.splitlines()) < 60, text


def test_a_config_refusal_exits_2_like_every_refusal_before_training(tmp_path: Path):
    result = run_cli(["model=llama3_8b", f"model.path={tmp_path}"], tmp_path / "run")
    refused(result, tmp_path / "run", "lora=tiny", "Fix: lora=default")


def test_run_log_warnings_auto_length_and_the_adapter_say_what_was_trained(tmp_path: Path):
    rows = [{"instruction": f"Name fruit {i}.", "input": "", "output": "pear"} for i in range(150)]
    rows.append({"instruction": "Tell a long story.", "input": "", "output": "and then " * 150})  # one outlier
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    run_dir = tmp_path / "run"
    result = run_cli(
        [
            "tokenizer=llama3",
            "model.resize_embeddings=true",
            "model.gradient_checkpointing=true",
            f"data.train={data}",
            "data.val=null",
            *TRAIN_BRIEFLY,
        ],
        run_dir,
    )
    ok(result)
    text = output(result)
    assert not [alarm for alarm in FALSE_ALARMS if alarm in text], text[-3000:]
    assert "set by the longest sample (" in text and "data.overlength=drop (drops those 1)" in text
    log = (run_dir / "seqtune.log").read_text()
    for line in ("preflight: no problems.", "attention: sdpa", "saved LoRA adapter", "run directory"):
        assert line in log, log
    adapter = run_dir / "adapter"
    assert (adapter / "adapter_config.json").stat().st_size < 10_000  # no list of 124,160 new token ids
    template = (adapter / "chat_template.jinja").read_text()
    assert "### Instruction:" in template and "<|start_header_id|>" not in template  # Alpaca, as trained
