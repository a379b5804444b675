"""KTO through the real CLI (recipe=lora_kto on a tiny model): the KTO metrics in metrics.jsonl and at evals, the
label batched from the token cache, early stopping with a crashed run resumed bitwise like the uninterrupted one
(LoRA dropout on), the export and its proof; and the refusals before step 1 with exit 2: a split with one label
(naming its file and key), a record whose label is not a boolean (file:line), stream mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import read_metrics, run_cli

pytestmark = pytest.mark.slow

COMMON = [
    "recipe=lora_kto",
    "train.max_steps=40",
    "train.save_every=2",
    "train.keep_last=0",
    "train.batch_size=4",
    "train.log_every=1",
    "lora.dropout=0.1",
    "padding=packed",
    "preflight.plot=false",
]
# Early stopping: only the first eval can improve by that much, so the run stops two evals later, at step 6.
EARLY = ["train.eval_every=2", "train.early_stop_patience=2", "train.early_stop_min_delta=100"]
METRICS = ("rewards/chosen", "rewards/rejected", "kl")
TIMINGS = {"tokens_per_s", "computed_tokens_per_s", "target_tokens_per_s", "peak_memory_mb"}
WORDS = ("red", "green", "blue", "amber", "violet")


def records(first: int, count: int) -> list[dict]:
    """Two records per prompt (its good answer, label true; a scrambled one, label false), alternating prompts so
    that no record follows one with its own prompt (the KL pair must be mismatched)."""
    good, bad = [], []
    for i in range(first, first + count):
        answer = " ".join(WORDS[(i + j) % 5] for j in range(1 + i % 4))
        prompt = f"List the colours of set {i}:\n"
        good.append({"prompt": prompt, "completion": answer, "label": True})
        bad.append({"prompt": prompt, "completion": f"set {i} has no colours", "label": False})
    return [r for pair in zip(good, bad[2:] + bad[:2], strict=True) for r in pair]


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> list[str]:
    directory = tmp_path_factory.mktemp("unpaired")
    return [
        f"data.train={write(directory / 'train.jsonl', records(0, 16))}",
        f"data.val={write(directory / 'val.jsonl', records(100, 4))}",
        f"data.cache_dir={directory / 'tokens'}",
    ]


def ok(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data) -> Path:
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    ok(run_cli([*COMMON, *EARLY, *data], run_dir))
    return run_dir


def test_a_kto_run_logs_its_metrics_stops_early_and_exports_with_the_proof(reference):
    metrics = read_metrics(reference)
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == list(range(1, 7))  # stopped early at step 6
    assert all(name in m for m in steps for name in METRICS)
    evals = [m for m in metrics if "eval_loss" in m]
    assert [m["step"] for m in evals] == [2, 4, 6] and all(f"eval_{name}" in m for m in evals for name in METRICS)
    assert all(m["kl"] >= 0 for m in steps) and all(m["eval_kl"] >= 0 for m in evals)
    # Learning separates the sides: desirable completions gain reward over undesirable ones.
    assert evals[-1]["eval_rewards/chosen"] > evals[-1]["eval_rewards/rejected"]
    plan = json.loads((reference / "plan.json").read_text())
    assert plan["sample_kind"] == "unpaired" and plan["sequences_per_sample"] == 2
    report = json.loads((reference / "preflight.json").read_text())
    assert any("16 desirable / 16 undesirable" in note for note in report["notes"])
    export = json.loads((reference / "export.json").read_text())
    assert export["ok"] and {a["artifact"] for a in export["artifacts"] if a["ok"]} == {"adapter", "best"}


def test_a_crashed_kto_run_resumes_bitwise_like_the_uninterrupted_one(reference, data, tmp_path):
    run_dir = tmp_path / "run"
    crashed = run_cli([*COMMON, *EARLY, *data], run_dir, env={"SEQTUNE_FAULT": "train:5"})
    assert crashed.returncode == 1, crashed.stderr[-2000:]
    resumed = run_cli([*COMMON, *EARLY, *data], run_dir)
    ok(resumed)
    assert "step_00000004 (step 4)" in resumed.stdout
    adapter = Path("adapter") / "adapter_model.safetensors"
    ours, theirs = load_file(str(run_dir / adapter)), load_file(str(reference / adapter))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

    def after(run: Path) -> list[dict]:
        return [{k: v for k, v in m.items() if k not in TIMINGS} for m in read_metrics(run) if m["step"] > 4]

    assert after(run_dir) == after(reference)


def refused(args: list[str], run_dir: Path) -> str:
    no_val = ["data.val=null", "train.eval_every=0"]
    result = run_cli([*COMMON, *no_val, "preflight.only=true", *args], run_dir)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return " ".join((result.stdout + result.stderr).split())


def test_a_split_with_one_label_is_refused_naming_its_file_and_key(tmp_path):
    only_good = write(tmp_path / "good.jsonl", [r for r in records(0, 16) if r["label"]])
    text = refused([f"data.train={only_good}", f"data.cache_dir={tmp_path / 'tokens'}"], tmp_path / "run")
    assert "data.train" in text and "good.jsonl" in text and "holds only desirable samples" in text, text[-3000:]


def test_a_label_that_is_not_a_boolean_and_stream_mode_are_refused(tmp_path):
    rows = records(0, 8)
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

    rows = records(0, 8)
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
