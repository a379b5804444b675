"""After training, what users expect (the real CLI, tiny models, data made here): the test split evaluated at the
end, greedy samples of validation prompts at each eval, early stopping with best/, DoRA and rsLoRA."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.cli import read_metrics, run_cli
from tests.support.exports import assert_adapter_matches_merged

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

WORDS = ("apple", "river", "candle", "orbit", "maple", "stone", "cloud", "ember", "harbor", "lantern")


def _ok(result) -> None:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nSTDOUT:\n{result.stdout[-4000:]}\nSTDERR:\n{result.stderr[-4000:]}"
    )


def _alpaca(path: Path, n: int, offset: int = 0) -> Path:
    # Every record distinct (copies would be dropped), and no validation record repeats a training one (refused).
    rows = [
        {
            "instruction": f"Item {offset * 1000 + i}: repeat the word {WORDS[(i + offset) % len(WORDS)]} "
            f"{1 + i % 3} times.",
            "input": "",
            "output": " ".join([WORDS[(i + offset) % len(WORDS)]] * (1 + i % 3)),
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    return {"train": _alpaca(root / "train.jsonl", 48), "val": _alpaca(root / "val.jsonl", 12, offset=3)}


def _args(data: dict[str, Path], *extra: str) -> list[str]:
    # The test split is the validation file: the same samples, so its loss must equal an eval's on the same weights.
    return [
        f"data.train={data['train']}",
        f"data.val={data['val']}",
        f"data.test={data['val']}",
        "train.batch_size=4",
        "train.log_every=1",
        "optim.lr=1e-2",
        *extra,
    ]


def _evals(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["eval_loss"] for m in read_metrics(run_dir) if "eval_loss" in m}


def _final(run_dir: Path) -> dict:
    return next(m for m in reversed(read_metrics(run_dir)) if "test_loss" in m)


@pytest.fixture(scope="module")
def sampled(tmp_path_factory, data) -> Path:
    run_dir = tmp_path_factory.mktemp("sampled") / "run"
    _ok(
        run_cli(
            _args(
                data,
                "train.max_steps=6",
                "train.eval_every=3",
                "lora.dropout=0.1",
                "train.eval_samples=2",
                "train.eval_sample_tokens=6",
                "logger=wandb",
                "logger.wandb.mode=offline",
            ),
            run_dir,
        )
    )
    return run_dir


def test_the_test_split_is_evaluated_once_at_the_end_like_an_eval(sampled: Path):
    final = _final(sampled)
    # Same samples (test = val), same weights (the last step evaluates too): the same summed token loss.
    assert final["step"] == 6 and final["test_loss"] == pytest.approx(_evals(sampled)[6], rel=1e-9)
    assert final["test_ppl"] == pytest.approx(math.exp(final["test_loss"]))
    val_targets = next(m["eval_targets"] for m in read_metrics(sampled) if "eval_targets" in m)
    assert final["test_targets"] == val_targets > 0
    log = (sampled / "seqtune.log").read_text()
    assert f"test: loss {final['test_loss']:.4f}" in log
    records = next((sampled / "wandb").glob("offline-run-*/*.wandb")).read_bytes()
    assert b"test_loss" in records and b"eval/samples" in records


def test_samples_of_validation_prompts_are_written_each_eval(sampled: Path, data):
    rows = [json.loads(line) for line in (sampled / "samples_generated.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [3, 3, 6, 6]
    val = [json.loads(line) for line in data["val"].read_text().splitlines()]
    for row in rows:
        line = int(row["location"].rsplit(":", 1)[1])
        assert row["location"] == f"{data['val']}:{line}" and line in (1, 2)
        assert val[line - 1]["instruction"] in row["prompt"] and row["prompt"].rstrip().endswith("### Response:")
        assert row["reference"] == val[line - 1]["output"]
        assert 1 <= row["new_tokens"] <= 6 and isinstance(row["completion"], str)


def test_samples_match_cached_greedy_generation_of_the_saved_adapter(sampled: Path):
    """The cache-free loop on the model as trained gives what transformers' generate (KV cache) gives with the
    exported adapter on the same base."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    from seqtune.config import load_resolved
    from seqtune.models import build_model

    cfg = load_resolved(sampled / "config.yaml")
    tokenizer = AutoTokenizer.from_pretrained(sampled / "adapter")
    tuned = PeftModel.from_pretrained(build_model(cfg.model, attn_implementation="sdpa"), sampled / "adapter").eval()
    rows = [json.loads(line) for line in (sampled / "samples_generated.jsonl").read_text().splitlines()]
    for row in (r for r in rows if r["step"] == 6):
        prompt = tokenizer(row["prompt"], add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            out = tuned.generate(
                input_ids=prompt,
                max_new_tokens=6,
                do_sample=False,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.eos_token_id,
            )
        new = out[0, prompt.shape[1] :]
        assert len(new) == row["new_tokens"]
        assert tokenizer.decode(new, skip_special_tokens=True) == row["completion"]


def test_samples_leave_training_exactly_as_without_them(sampled: Path, data, tmp_path: Path):
    """lora.dropout=0.1 draws from the RNG every step: generating (eval mode, forked RNG) must not shift it."""
    plain = tmp_path / "plain"
    _ok(run_cli(_args(data, "train.max_steps=6", "train.eval_every=3", "lora.dropout=0.1"), plain))
    losses = [[m["loss"] for m in read_metrics(run) if "loss" in m] for run in (sampled, plain)]
    assert losses[0] == losses[1] and len(losses[0]) == 6
    assert _evals(sampled) == _evals(plain)


EARLY = [
    "train.max_steps=40",
    "train.eval_every=2",
    "train.early_stop_patience=2",
    # Only the first eval can improve on "no eval yet" by that much: the run must stop two evals later, at
    # step 6, and end on the lowest eval (min_delta gates patience only, as in transformers).
    "train.early_stop_min_delta=100",
]
WEIGHTS = {"lora_sft": "adapter_model.safetensors", "full_sft": "model.safetensors"}
# lora_sft's early-stopping run also saves every 4 steps, with dropout on: the uninterrupted run the resume test
# compares with (resume is exact for every stochastic part), trained once for both tests.
SAVED = ["train.save_every=4", "train.keep_last=0", "lora.dropout=0.1"]


@pytest.fixture(scope="module")
def early_stopped(tmp_path_factory, data):
    """The early-stopping run of a recipe, trained once and on demand."""
    done: dict[str, Path] = {}

    def get(recipe: str) -> Path:
        if recipe not in done:
            run_dir = tmp_path_factory.mktemp(f"early-{recipe}") / "run"
            _ok(run_cli(_args(data, f"recipe={recipe}", *EARLY, *(SAVED if recipe == "lora_sft" else [])), run_dir))
            done[recipe] = run_dir
        return done[recipe]

    return get


@pytest.mark.parametrize("recipe", ["lora_sft", "full_sft"])
def test_early_stopping_stops_keeps_best_and_ends_on_it(early_stopped, recipe: str):
    run_dir = early_stopped(recipe)
    metrics = read_metrics(run_dir)
    assert max(m["step"] for m in metrics if "loss" in m) == 6
    stopped = [m for m in metrics if m.get("early_stopped")]
    evals = _evals(run_dir)
    lowest = min(evals, key=evals.get)
    assert [m["step"] for m in stopped] == [6] and stopped[0]["best_step"] == lowest
    assert sorted(evals) == [2, 4, 6] and evals[6] < evals[2]  # training helped; the rule still says stop
    # The run ended on best/ (the lowest eval): the test split (= val) gives its eval loss, the export is best/'s.
    final = _final(run_dir)
    assert final["best_step"] == lowest and final["test_loss"] == pytest.approx(evals[lowest], rel=1e-6)
    export = "adapter" if recipe == "lora_sft" else "model"
    best, last = load_file(run_dir / "best" / WEIGHTS[recipe]), load_file(run_dir / export / WEIGHTS[recipe])
    assert best.keys() == last.keys()
    for name in best:
        torch.testing.assert_close(last[name], best[name], rtol=0, atol=0)
    assert not list(run_dir.glob(".tmp-*"))  # no temporary left behind
    log = (run_dir / "seqtune.log").read_text()
    assert "early stopping at step 6" in log
    assert ("restored the best eval's weights" in log) == (lowest != 6)


def test_early_stopping_resumes_where_it_stood(tmp_path: Path, data, early_stopped):
    """Its state is a checkpoint part: a run killed after step 4 resumes and stops at step 6 as the whole run did."""
    whole, resumed = early_stopped("lora_sft"), tmp_path / "resumed"
    # With dropout on (SAVED): resume is exact for every stochastic part, so the evals and the test loss are equal.
    args = _args(data, "recipe=lora_sft", *EARLY, *SAVED)
    crashed = run_cli(args, resumed, env={"SEQTUNE_FAULT": "train:5"})
    assert crashed.returncode == 1 and (resumed / "checkpoints" / "step_00000004").is_dir()
    _ok(run_cli(args, resumed))
    assert _evals(resumed) == _evals(whole)
    assert _final(resumed)["test_loss"] == _final(whole)["test_loss"]
    best = [load_file(run / "best" / "adapter_model.safetensors") for run in (whole, resumed)]
    assert best[0].keys() == best[1].keys() and all(torch.equal(best[0][k], best[1][k]) for k in best[0])


def test_dora_and_rslora_train_export_and_count_in_the_estimate(tmp_path: Path, data):
    run_dir, lora_only = tmp_path / "dora", tmp_path / "lora"
    common = _args(data, "train.max_steps=3", "train.eval_every=0", "lora.modules_to_save=[]")
    _ok(run_cli([*common, "lora.use_dora=true", "lora.use_rslora=true", "train.export_merged=true"], run_dir))
    config = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    assert config["use_dora"] is True and config["use_rslora"] is True
    assert any("lora_magnitude_vector" in k for k in load_file(run_dir / "adapter" / "adapter_model.safetensors"))
    assert_adapter_matches_merged(run_dir, seq=24)
    _ok(run_cli([*common, "preflight.only=true"], lora_only))
    memory = [json.loads((run / "preflight.json").read_text())["memory"] for run in (run_dir, lora_only)]
    assert memory[0]["activations_gib"] > memory[1]["activations_gib"]


def test_a_sweep_writes_one_summary_of_every_job_failed_ones_included(tmp_path: Path, data):
    """Three jobs: one trains, one fails while training (an injected error at step 2), one is refused (exit 2)."""
    import csv

    sweep = tmp_path / "sweep"
    result = run_cli(
        ["-m", "train.max_steps=1,3,0", *_args(data, "train.eval_every=1"), f"hydra.sweep.dir={sweep}"],
        tmp_path / "unused",
        env={"SEQTUNE_FAULT": "train:2"},
    )
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]  # a job failed while training
    jobs = json.loads((sweep / "sweep_summary.json").read_text())["jobs"]
    assert [(j["job"], j["status"], j["exit_code"]) for j in jobs] == [
        (0, "completed", 0),
        (1, "failed", 1),
        (2, "failed", 2),
    ]
    assert jobs[0]["step"] == 1 and jobs[0]["test_loss"] == pytest.approx(jobs[0]["eval_loss"], rel=1e-9)
    assert "SEQTUNE_FAULT" in jobs[1]["error"] and "train.max_steps=0 must be >= 1" in jobs[2]["error"]
    assert all(f"train.max_steps={n}" in j["overrides"] for n, j in zip((1, 3, 0), jobs, strict=True))
    with (sweep / "sweep_summary.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [row["train.max_steps"] for row in table] == ["1", "3", "0"]
    assert [row["status"] for row in table] == ["completed", "failed", "failed"]
    assert table[0]["data.train"] == str(data["train"])
    markdown = (sweep / "sweep_summary.md").read_text()
    assert f"Every job: data.train={data['train']}" in markdown and "| job | train.max_steps | status |" in markdown
    assert "sweep summary (3 job(s))" in result.stdout
    assert "2 of 3 job(s) did not succeed" in result.stderr
