"""GRPO through the real CLI (recipe=lora_grpo on the tiny model and the bundled prompts): the metrics and
completions.jsonl of a short run, a crashed run resumed bitwise like the uninterrupted one (LoRA dropout on, the
sampling generators checkpointed), and the reward refusals at preflight (exit 2, naming file:line) before any
generation."""

from __future__ import annotations

import html
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from seqtune.config.recipe_spec import recipe_spec
from seqtune.rollout.examples import OTHER_KIND_COST
from seqtune.rollout.stage import metric_names as stage_metric_names
from tests.support.cli import REPO, assert_resumed_like, read_metrics, run_cli
from tests.support.shared_runs import ok

pytestmark = pytest.mark.slow

STEPS = 4
COMMON = [
    "recipe=lora_grpo",
    f"train.max_steps={STEPS}",
    "train.save_every=2",
    "train.keep_last=0",
    "train.batch_size=2",
    "train.log_every=1",
    "train.eval_every=2",
    "train.eval_batches=1",
    "rollout.num_generations=2",
    "rollout.max_completion_tokens=4",
    "grpo.beta=0.05",  # the reference (adapters off) and the kl metric take part
    "lora.dropout=0.1",
    "preflight.plot=false",
]
# The run's reward function (the preset's rollout.rewards) names the stage's metric rewards/kind_share.
REWARDS = [SimpleNamespace(name="kind_share")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("grpo") / "run"
    ok(run_cli(COMMON, run_dir))
    return run_dir


def logged_names(row: dict) -> tuple[str, ...]:
    """The objective's metric names in a training record: the loop logs them between "loss" and "lr"."""
    keys = list(row)
    return tuple(keys[keys.index("loss") + 1 : keys.index("lr")])


def plan_terminators(run_dir: Path) -> list[str]:
    return list(json.loads((run_dir / "plan.json").read_text())["tokens"]["terminators"].values())


def test_a_grpo_run_logs_rewards_and_writes_completions(reference):
    metrics = read_metrics(reference)
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    names = recipe_spec("grpo").loss_facts(stage=stage_metric_names(REWARDS)).metric_names
    assert all(logged_names(m) == names for m in steps), (logged_names(steps[0]), names)
    evals = [m for m in metrics if "eval_loss" in m]
    assert [m["step"] for m in evals] == [2, 4] and all(f"eval_{name}" in m for m in evals for name in names)
    assert all(-OTHER_KIND_COST <= m["reward"] <= 1.0 and 1 <= m["completion_length"] <= 4 for m in steps)
    assert any(m["kl"] > 0 for m in steps[1:])  # the adapters moved away from the reference
    lines = [json.loads(line) for line in (reference / "completions.jsonl").read_text().splitlines()]
    # eval_batches=1 micro-batch of 2 prompts x 2 completions at each of steps 2 and 4
    assert [line["step"] for line in lines] == [2] * 4 + [4] * 4
    assert all(set(line) == {"step", "prompt", "completion", "stop", "reward", "rewards"} for line in lines)
    # string prompts: a completion stops at a trained terminator or runs to the limit (stop null), never elsewhere
    assert all(line["stop"] in (*plan_terminators(reference), None) for line in lines)
    assert all(line["rewards"]["kind_share"] == pytest.approx(line["reward"]) for line in lines)
    plan = json.loads((reference / "plan.json").read_text())
    assert plan["sample_kind"] == "prompt" and plan["recipe"] == "grpo" and plan["step_repeats"] == 1
    # samples.html: preflight's prompts, then every eval's prompts, completions and rewards, escaped
    page = (reference / "samples.html").read_text()
    assert page.count('<section id="completions">') == 1 and 'id="step-2"' in page and 'id="step-4"' in page
    assert "<th>kind_share</th>" in page and 'data-split="train"' in page
    assert all(html.escape(line["completion"]) in page for line in lines)
    # the export after a GRPO run carries its proof (the adapter reloads to the trained logits and stops at eos,
    # and at the template's turn closer that data.format=prompt resolves for message prompts: plan.tokens)
    report = json.loads((reference / "export.json").read_text())
    assert report["ok"] and [(a["artifact"], a["ok"]) for a in report["artifacts"]] == [("adapter", True)]
    assert plan["tokens"]["turn_closer"] is not None
    assert report["artifacts"][0]["checks"]["stops"] == {"</s>": True, "<|end|>": True}
    # What the memory estimate sizes the generation KV cache and the update with (the spec's declaration, resolved)
    assert plan["completions_per_sample"] == 2 and plan["completion_tokens"] == 4
    # Preflight's reports describe prompts as prompts: no trainable share, no zero-target or unterminated counts
    train = json.loads((reference / "preflight.json").read_text())["splits"]["train"]
    assert train["trainable_fraction"] is None and train["zero_target"] is None
    assert train["content"]["unterminated_spans"] is None
    log = (reference / "seqtune.log").read_text()
    assert "prompt as sampling starts from it" in log and " targets)" not in log


def as_written_before_turn_closer(checkpoint: Path, cache: Path) -> None:
    """Rewrite `checkpoint`'s manifest and the tokenizer record under the token cache root `cache` as seqtune wrote
    them before plan.tokens.turn_closer existed (tokenizer record v2): no turn_closer in either, checksums valid."""
    import hashlib

    manifest = json.loads((checkpoint / "manifest.json").read_text())
    del manifest["plan"]["tokens"]["turn_closer"]
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    (record,) = (cache / "tokenizer-facts").glob("*.json")
    body = json.loads(record.read_text())["body"]
    del body["tokens"]["turn_closer"]
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    record.write_text(json.dumps({"sha256": digest, "body": body}))


def test_a_crashed_grpo_run_resumes_bitwise_like_the_uninterrupted_one(reference, tmp_path):
    """...from a checkpoint and a tokenizer record written before turn_closer (record v2): the record is rebuilt,
    the closer derived again from the same tokenizer (v2 refused message prompts whose closer was no stop id, so
    sampling stops where it did), and the run continues exactly."""
    run_dir, own_cache = tmp_path / "run", {"SEQTUNE_CACHE": str(tmp_path / "cache")}
    crashed = run_cli(COMMON, run_dir, env={"SEQTUNE_FAULT": "train:4", **own_cache})
    assert crashed.returncode == 1, crashed.stderr[-2000:]
    as_written_before_turn_closer(run_dir / "checkpoints" / "step_00000002", tmp_path / "cache" / "tokens")
    resumed = run_cli(COMMON, run_dir, env=own_cache)
    ok(resumed)
    assert "step_00000002 (step 2)" in resumed.stdout
    closer = json.loads((run_dir / "plan.json").read_text())["tokens"]["turn_closer"]
    assert closer is not None and closer == json.loads((reference / "plan.json").read_text())["tokens"]["turn_closer"]
    (record,) = (tmp_path / "cache" / "tokens" / "tokenizer-facts").glob("*.json")
    assert json.loads(record.read_text())["body"]["tokens"]["turn_closer"] == closer  # rebuilt as v3
    assert_resumed_like(run_dir, reference, after_step=2)


def test_reward_problems_are_refused_before_any_generation(tmp_path):
    rewards = tmp_path / "my_rewards.py"
    rewards.write_text(
        "def broken(prompts, completions, **columns):\n"
        "    raise KeyError('solution')\n"
        "\n"
        "def needs(prompts, completions, solution, **columns):\n"
        "    return [0.0] * len(completions)\n"
    )
    run_dir = tmp_path / "run"
    result = run_cli([*COMMON, f"rollout.rewards=[{rewards}:broken,{rewards}:needs]"], run_dir)
    assert result.returncode == 2, result.stdout[-2000:]
    out = " ".join(result.stdout.split())
    assert f"rollout.rewards[0]={rewards}:broken ({rewards}:1) failed a dry call" in out
    assert f"(raised at {rewards}:2)" in out
    assert "reads column solution, which " in out and "train.jsonl:1 lacks (the records have: kind)" in out
    assert not (run_dir / "completions.jsonl").exists() and not (run_dir / "metrics.jsonl").exists()


ITERATED = [*COMMON, "grpo.num_iterations=2", "train.max_steps=6", "train.save_every=3"]
# RLOO on the same shared online stage: only the recipe and its own group's keys differ.
RLOO_ITERATED = [
    a.replace("lora_grpo", "lora_rloo").replace("grpo.", "rloo.") for a in ITERATED if a != "grpo.loss=dapo"
]


@pytest.fixture(scope="module", params=["grpo", "rloo"])
def iterated(tmp_path_factory, request) -> tuple[Path, list[str]]:
    args = ITERATED if request.param == "grpo" else RLOO_ITERATED
    run_dir = tmp_path_factory.mktemp(f"{request.param}_mu") / "run"
    ok(run_cli(args, run_dir))
    return run_dir, args


def test_num_iterations_reuses_each_generation_batch_for_that_many_steps(iterated):
    """grpo.num_iterations=2 (rloo.num_iterations=2 alike): steps 1-2, 3-4, 5-6 train on one generation batch each
    (the same rewards and lengths), the 2nd step with the 1st's log-probabilities (a ratio off 1), and the plan
    counts the repeated steps."""
    iterated, args = iterated
    steps = [m for m in read_metrics(iterated) if "loss" in m]
    assert [m["step"] for m in steps] == list(range(1, 7))
    recipe = "grpo" if args is ITERATED else "rloo"
    names = recipe_spec(recipe).loss_facts(stage=stage_metric_names(REWARDS)).metric_names
    assert all(logged_names(m) == names for m in steps), (logged_names(steps[0]), names)
    for first, second in zip(steps[::2], steps[1::2], strict=True):
        for name in ("reward", "reward_std", "completion_length", "completions/clipped_ratio"):
            assert second[name] == first[name], (second["step"], name)
        assert first["clip_ratio"] == 0.0  # the generation step: ratio 1
    assert steps[0]["reward"] != steps[2]["reward"] or steps[0]["completion_length"] != steps[2]["completion_length"]
    assert any(m["clip_ratio"] > 0 for m in steps[1::2])  # a reused step moved some tokens past the clip
    plan = json.loads((iterated / "plan.json").read_text())
    assert plan["step_repeats"] == 2 and plan["batches"]["step_repeats"] == 2
    report = json.loads((iterated / "preflight.json").read_text())
    assert json.dumps(report).count('"steps_per_epoch": 128') >= 1  # 128 prompts / 2 per step, each step twice


def test_a_run_killed_mid_cycle_resumes_bitwise(iterated, tmp_path):
    """SIGKILL while saving step 6: step 3's checkpoint (the 1st step of a generation batch that step 4 reuses) holds
    the rollouts and their log-probabilities, so the resumed steps 4-6 are the uninterrupted run's bit for bit (GRPO
    and RLOO: the stage they share keeps the buffer)."""
    iterated, args = iterated
    run_dir = tmp_path / "run"
    crashed = run_cli(args, run_dir, env={"SEQTUNE_FAULT": "save:6"})
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    resumed = run_cli(args, run_dir)
    ok(resumed)
    assert "step_00000003 (step 3)" in resumed.stdout
    assert_resumed_like(run_dir, iterated, after_step=3)


def test_early_stopping_watches_the_eval_reward(tmp_path):
    """train.early_stop_patience on a GRPO run watches eval_reward (the recipe spec's metric, higher is better):
    best/ is the highest eval's, the run stops after `patience` evals without a higher one and ends on best/."""
    run_dir = tmp_path / "run"
    args = [*COMMON, "train.max_steps=12", "train.eval_every=2", "train.save_every=0", "train.keep_last=2"]
    args.append("train.early_stop_patience=1")
    ok(run_cli(args, run_dir))
    metrics = read_metrics(run_dir)
    evals = [m for m in metrics if "eval_reward" in m]
    assert all("best_eval_reward" in m and "best_eval_loss" not in m for m in evals)
    for n, m in enumerate(evals):
        rewards = [e["eval_reward"] for e in evals[: n + 1]]
        assert m["best_eval_reward"] == max(rewards)
        assert m["best_step"] == evals[rewards.index(max(rewards))]["step"]
    # patience 1: the first eval that is not the highest so far stops the run (6 rising eval rewards would not)
    assert evals[-1].get("early_stopped") is True and evals[-1]["step"] < 12
    assert (run_dir / "best").is_dir()
    best_step = evals[-1]["best_step"]
    ours = load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))
    saved = load_file(str(run_dir / "best" / "adapter_model.safetensors"))
    assert best_step != evals[-1]["step"] and all(torch.equal(ours[k], saved[k]) for k in ours)
    # the model card shows the metric early stopping watched (the spec's), not an eval loss it never watched
    best = max(e["eval_reward"] for e in evals)
    for kind in ("adapter", "best"):
        card = (run_dir / kind / "README.md").read_text()
        assert f"- best eval reward: {best:.4f} (step {best_step})" in card, card
        assert f"- final eval reward: {evals[-1]['eval_reward']:.4f}" in card and "best eval loss" not in card


def leaning_to_end_of_turn(root: Path) -> tuple[Path, int]:
    """A tiny checkpoint (the bundled tokenizer, whose chat template closes a turn with <|end|>, no terminator of
    the tinyllama family) that samples <|end|> with p ~0.4 at each token: completions of 4 tokens stop often."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from seqtune.config.schema import ModelConfig
    from seqtune.models import build_model
    from seqtune.tokenizers import BUNDLED_DIR

    node = OmegaConf.merge(
        OmegaConf.structured(ModelConfig), OmegaConf.load(REPO / "seqtune/configs/model/tinyllama_tiny.yaml")
    )
    model, tokenizer = (
        build_model(OmegaConf.to_object(node), attn_implementation="sdpa"),
        AutoTokenizer.from_pretrained(BUNDLED_DIR),
    )
    end = int(tokenizer.convert_tokens_to_ids("<|end|>"))
    with torch.no_grad():  # every hidden state leans along dim 0; only <|end|>'s head row reads it
        model.model.embed_tokens.weight[:, 0] += 4.0
        model.lm_head.weight[end, 0] = 1.0
    for config in (model.config, model.generation_config):
        config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    model.save_pretrained(root / "ckpt", safe_serialization=True)
    tokenizer.save_pretrained(root / "ckpt")
    return root / "ckpt", end


def test_message_prompts_stop_at_the_templates_turn_closer(tmp_path):
    """data.format=prompt with message-list prompts on a family whose terminators lack the template's turn closer:
    preflight resolves the closer (plan.tokens.turn_closer), the run trains, its completions stop there and so does
    its export (generation_config.json's eos_token_id, proven); the same prompts as strings are no assistant turns
    and never stop at it while training (the closer is the format's fact, so their export stops there too)."""
    checkpoint, end = leaning_to_end_of_turn(tmp_path)
    stops = {}
    for shape in ("messages", "strings"):
        for split, n in (("train", 16), ("val", 4)):
            with (tmp_path / f"{shape}_{split}.jsonl").open("w") as out:
                for i in range(n):
                    text = f"{split}: say {'abcd'[i % 4]} {i}"
                    prompt = [{"role": "user", "content": text}] if shape == "messages" else text
                    out.write(json.dumps({"prompt": prompt, "kind": "digits"}) + "\n")
        run_dir = tmp_path / shape
        args = [*COMMON, "model=tinyllama_1b", f"model.path={checkpoint}", "lora=default", "train.max_steps=3"]
        args += [f"data.train={tmp_path / f'{shape}_train.jsonl'}", f"data.val={tmp_path / f'{shape}_val.jsonl'}"]
        ok(run_cli([*args, "train.eval_every=3", "train.save_every=0", "train.keep_last=2"], run_dir))
        plan = json.loads((run_dir / "plan.json").read_text())
        assert plan["tokens"]["turn_closer"] == end and str(end) not in plan["tokens"]["terminators"]
        lines = [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]
        stops[shape] = [line["stop"] for line in lines]
        assert len(read_metrics(run_dir)) >= 3
        # the export stops where training's completions did: at eos and at the turn closer the plan resolved
        generation = json.loads((run_dir / "adapter" / "generation_config.json").read_text())
        assert generation["eos_token_id"] == [plan["tokens"]["eos_id"], end], generation
        assert json.loads((run_dir / "export.json").read_text())["ok"]
    assert stops["messages"].count("<|end|>") >= 2 and set(stops["messages"]) <= {"<|end|>", "</s>", None}
    assert "<|end|>" not in stops["strings"] and None in stops["strings"]


VERL_REWARD = """\
def gsm8k(completions, extra_info, reward_model, **kwargs):
    # Each record's own struct columns, intact: two records share one prompt and differ in them.
    for info, truth in zip(extra_info, reward_model, strict=True):
        if truth["ground_truth"] != str(info["index"] * 3) or not info["answer"].endswith(truth["ground_truth"]):
            raise ValueError(f"columns of another record: {info} {truth}")
    answers = [info["answer"].split("####")[-1].strip() for info in extra_info]
    return [float(c[-1]["content"].strip().endswith(a)) for c, a in zip(completions, answers, strict=True)]
"""


def write_verl_gsm8k(path: Path, rows: int = 8) -> None:
    """GSM8K as verl publishes it: `prompt` a message list, `reward_model` and `extra_info` struct columns, in
    Parquet; records 0 and 1 ask the same question with different answers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def record(i: int) -> dict:
        question = f"What is {max(i, 1)} times 3?"
        return {
            "data_source": "openai/gsm8k",
            "prompt": [{"content": question + ' Output the final answer after "####".', "role": "user"}],
            "ability": "math",
            "reward_model": {"ground_truth": str(i * 3), "style": "rule"},
            "extra_info": {"answer": f"{i} * 3 = {i * 3}\n#### {i * 3}", "index": i, "question": question},
        }

    pq.write_table(pa.Table.from_pylist([record(i) for i in range(rows)]), path)


def test_gsm8k_as_verl_publishes_it_trains_with_a_reward_reading_its_struct_columns(tmp_path):
    """The struct columns reach the rewards from the token cache (no data file read again), each record its own
    although two share a prompt (and neither is dropped as a duplicate)."""
    data, rewards = tmp_path / "gsm8k.parquet", tmp_path / "verl_rewards.py"
    write_verl_gsm8k(data)
    rewards.write_text(VERL_REWARD)
    run_dir = tmp_path / "run"
    args = [*COMMON, f"data.train={data}", "data.val=null", "data.format=prompt", "train.eval_every=0"]
    result = run_cli([*args, f"rollout.rewards=[{rewards}:gsm8k]", "train.max_steps=2"], run_dir)
    ok(result)
    assert "duplicate" not in (run_dir / "rejects.jsonl").read_text()
    assert [m["step"] for m in read_metrics(run_dir) if "loss" in m] == [1, 2]
