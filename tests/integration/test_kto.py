"""KTO through the real CLI (recipe=lora_kto on a tiny model): the contract run (tests/integration/
test_recipe_contract.py checks its metric names, early stopping, export and resume) learns to separate the sides
with a non-negative KL estimate; the refusals before step 1 with exit 2: a split with one label (naming its file
and key), a record whose label is not a boolean (file:line), stream mode; chat KTO on Llama 3's template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.cli import read_metrics, run_cli
from tests.support.recipes import ok, unpaired, write

pytestmark = pytest.mark.slow

COMMON = ["recipe=lora_kto", "train.batch_size=4", "padding=packed", "preflight.plot=false"]


def test_a_kto_run_separates_the_sides_with_a_non_negative_kl_estimate(recipe_runs):
    reference = recipe_runs.reference("kto")
    metrics = read_metrics(reference)
    steps, evals = [m for m in metrics if "loss" in m], [m for m in metrics if "eval_loss" in m]
    assert all(m["kl"] >= 0 for m in steps) and all(m["eval_kl"] >= 0 for m in evals)
    # Learning separates the sides: desirable completions gain reward over undesirable ones.
    assert evals[-1]["eval_rewards/chosen"] > evals[-1]["eval_rewards/rejected"]
    plan = json.loads((reference / "plan.json").read_text())
    assert plan["sample_kind"] == "unpaired" and plan["sequences_per_sample"] == 2
    report = json.loads((reference / "preflight.json").read_text())
    assert any("16 desirable / 16 undesirable" in note for note in report["notes"])


def refused(args: list[str], run_dir: Path) -> str:
    no_val = ["data.val=null", "train.eval_every=0"]
    result = run_cli([*COMMON, *no_val, "preflight.only=true", *args], run_dir)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return " ".join((result.stdout + result.stderr).split())


def test_a_split_with_one_label_is_refused_naming_its_file_and_key(tmp_path):
    only_good = write(tmp_path / "good.jsonl", [r for r in unpaired(0, 16) if r["label"]])
    text = refused([f"data.train={only_good}", f"data.cache_dir={tmp_path / 'tokens'}"], tmp_path / "run")
    assert "data.train" in text and "good.jsonl" in text and "holds only desirable samples" in text, text[-3000:]


def test_a_label_that_is_not_a_boolean_and_stream_mode_are_refused(tmp_path):
    rows = unpaired(0, 8)
    rows[2] = {**rows[2], "label": "yes"}
    bad = write(tmp_path / "bad.jsonl", rows)
    text = refused([f"data.train={bad}", f"data.cache_dir={tmp_path / 'tokens'}"], tmp_path / "run")
    assert "bad.jsonl:3" in text and "wrong_type" in text and "expected true" in text, text[-3000:]
    text = refused([f"data.train={bad}", "data.mode=stream", "padding=longest"], tmp_path / "stream")
    assert "data.mode=stream" in text and "Fix: data.mode=cached" in text, text[-3000:]


def conversational(shape: str, rows: list[dict]) -> list[dict]:
    """The records as message lists: LLaMA-Factory's {messages, label} (kto_en_demo.json; an earlier exchange
    before the last one, which is the completion) or TRL's conversational unpaired {prompt, completion, label}."""
    out = []
    for i, r in enumerate(rows):
        user, reply = {"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["completion"]}
        if shape == "llamafactory":
            earlier = [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": "Hi."}] if i % 3 else []
            out.append({"messages": [*earlier, user, reply], "label": r["label"]})
        else:
            out.append({"prompt": [user], "completion": [reply], "label": r["label"]})
    return out


@pytest.mark.parametrize(("shape", "recipe"), [("llamafactory", "lora_kto"), ("trl", "full_kto")])
def test_chat_kto_on_the_llama3_tokenizer_trains_from_each_published_shape(tmp_path, shape, recipe):
    """Unpaired feedback as message lists, read as published and rendered with Llama 3's chat template (a
    templated conversion was refused as control-token text, the records themselves as missing prompt and
    completion): only the completion is trained, ending on <|eot_id|>; the KL pair is the prompt with the previous
    record's reply. recipe=full_kto trains every weight against a frozen copy."""
    from transformers import AutoTokenizer

    from seqtune.data.cache import TokenCache

    rows = unpaired(0, 8)
    if shape == "llamafactory":  # a JSON array, as LLaMA-Factory publishes it
        train = tmp_path / "kto_en_demo.json"
        train.write_text(json.dumps(conversational(shape, rows), indent=2))
    else:
        train = write(tmp_path / "train.jsonl", conversational(shape, rows))
    args = [f"recipe={recipe}", "model=llama3_tiny", "tokenizer=llama3", "model.resize_embeddings=true"]
    args += [f"data.train={train}", "data.val=null", "train.eval_every=0", "train.max_steps=2", "train.log_every=1"]
    result = run_cli([*args, "train.batch_size=4", "preflight.plot=false", "preflight.show=0"], tmp_path / "run")
    ok(result)
    steps = [m for m in read_metrics(tmp_path / "run") if "loss" in m]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(m["loss"])) for m in steps)
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    cache = TokenCache.open(Path(plan["caches"]["train"]))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run" / ("adapter" if recipe == "lora_kto" else "model"))
    completion, kl = cache[2], cache[3]  # record 2: its completion, and its prompt with record 1's reply
    for sequence in (completion, kl):
        text = tokenizer.decode(sequence.input_ids)
        assert "<|start_header_id|>user<|end_header_id|>" in text and rows[1]["prompt"].strip() in text, text
    assert (
        tokenizer.decode(completion.input_ids[completion.labels != -100])
        == rows[1]["completion"] + "<|eot_id|><|end_of_text|>"
    )
    assert tokenizer.decode(kl.input_ids[kl.labels != -100]) == rows[0]["completion"] + "<|eot_id|><|end_of_text|>"
