"""grpo.num_iterations > 1 (TRL's mu) through the online stage and GRPO's loss, on a tiny random model and the bundled tokenizer:
the 2nd pass over a step's prompts trains on the 1st pass's rollout with its generation-time log-probabilities
(after an update, so the ratio is not 1), its loss equals TRL's GRPOTrainer._compute_loss fed the same rollout,
old_per_token_logps and advantages to 1e-5; a new cycle generates again; and the reused rollouts survive a
state_dict round trip (what a resume mid-cycle loads)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer

from seqtune.config.rollout import RolloutConfig
from seqtune.distributed import DistEnv
from seqtune.recipes.grpo import SPEC as GRPO_SPEC
from seqtune.recipes.grpo import GrpoConfig, GrpoLoss
from seqtune.recipes.grpo.loss import GrpoSurrogate, group_advantages
from seqtune.rollout.objective import OnlineObjective
from seqtune.rollout.prompts import PromptTable
from seqtune.rollout.rewards import load_rewards
from seqtune.rollout.stage import RolloutStage
from seqtune.train.objectives import Position
from tests.support.rollout import TOKENIZER, tiny_model

G, C = 4, 5
PROMPTS = [[1, 301, 302, 303], [1, 400, 401]]  # two prompts of different lengths (left-padded when generating)


def objective(
    tokenizer,
    loss: GrpoLoss,
    *,
    temperature: float = 1.0,
    rewards: tuple[str, ...] = ("seqtune.rollout.examples:short",),
    **settings,
) -> OnlineObjective:
    table = PromptTable()
    for key, ids in enumerate(PROMPTS):  # each prompt's record under its digest (here: its index)
        table.records[key] = {"prompt": tokenizer.decode(ids[1:])}
    rollout = RolloutConfig(rewards=list(rewards), num_generations=G, max_completion_tokens=C, temperature=temperature)
    stage = RolloutStage(
        cfg=rollout,
        rewards=load_rewards(list(rollout.rewards)),
        table=table,
        tokenizer=tokenizer,
        reference=None,
        stop_ids=frozenset({tokenizer.eos_token_id}),
        turn_closer=None,
        pad_id=tokenizer.pad_token_id or 0,
        env=DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")),
        seed=3,
        completions_path=Path(tempfile.mkdtemp()) / "completions.jsonl",
    )
    surrogate = GrpoSurrogate(GrpoConfig(num_iterations=2, loss=loss, **settings))
    return OnlineObjective(stage=stage, loss=surrogate, facts=GRPO_SPEC.loss_facts(stage=stage.metric_names))


def at(grpo: OnlineObjective, step: int, micro_batch: int = 0) -> OnlineObjective:
    """What the loop tells the stage before a training micro-batch (plan.step_repeats=2)."""
    grpo.at(Position(step=step, micro_batch=micro_batch, repeat=step % 2, repeats=2))
    return grpo


def batch() -> dict[str, torch.Tensor]:
    width = max(map(len, PROMPTS))
    ids = torch.zeros(len(PROMPTS), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(PROMPTS):
        ids[r, : len(p)], mask[r, : len(p)] = torch.tensor(p), 1
    targets = torch.full_like(ids, -100)
    targets[:, 1] = 5  # each prompt's one anchor target: a real prompt, not a filler
    keys = torch.arange(len(PROMPTS))
    return {"input_ids": ids, "attention_mask": mask, "targets": targets, "record_key": keys}


def trl_loss(model, scored, cfg: GrpoConfig, temperature: float) -> float:
    from trl import GRPOConfig, GRPOTrainer

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=len(PROMPTS) * G,
            num_generations=G,
            max_completion_length=C,
            loss_type=str(cfg.loss),
            beta=0.0,
            epsilon=cfg.epsilon,
            epsilon_high=cfg.clip_high,
            temperature=temperature,
            num_iterations=cfg.num_iterations,
            importance_sampling_level=str(cfg.importance_sampling_level),
            use_cpu=True,
            report_to=[],
            bf16=False,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=lambda prompts, completions, **kw: [0.0] * len(prompts),
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["x"] * (len(PROMPTS) * G)}),
            processing_class=AutoTokenizer.from_pretrained(TOKENIZER),
        )
    trainer.current_gradient_accumulation_steps = 1
    ro = scored.sample
    completion_len = ro.completion_mask.shape[1]
    inputs = {
        "prompt_ids": ro.sequences[:, :-completion_len],
        "prompt_mask": ro.attention_mask[:, :-completion_len],
        "completion_ids": ro.sequences[:, -completion_len:],
        "completion_mask": ro.completion_mask,
        "advantages": group_advantages(scored.total, G)[0],
        "old_per_token_logps": scored.old_logps,
        "num_items_in_batch": ro.completion_mask.sum().float(),
    }
    trainer.model.train()
    return float(trainer._compute_loss(trainer.model, inputs).detach())


@pytest.mark.parametrize(
    "loss,level", [*((loss, "token") for loss in GrpoLoss), (GrpoLoss.grpo, "sequence")], ids=lambda v: str(v)
)
def test_the_second_iteration_reuses_the_rollout_and_matches_trl(loss, level):
    """Each token normalisation, and GSPO (grpo.importance_sampling_level=sequence: one ratio per completion)."""
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    model = tiny_model().train()  # no dropout in the config: both sides see one function
    grpo = objective(tokenizer, loss, epsilon_high=0.28, temperature=0.7, importance_sampling_level=level)
    first, _ = at(grpo, 0)(model, batch())
    scored = grpo.stage.buffer[0]
    assert scored.old_logps is not None and not scored.old_logps.requires_grad
    old = scored.old_logps.clone()
    with torch.no_grad():  # an optimizer step's worth of change, so the ratio leaves 1 and the clip takes part
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    second, metrics = at(grpo, 1)(model, batch())
    assert grpo.stage.buffer[0] is scored and torch.equal(
        scored.old_logps, old
    )  # no new generation, old log-probs kept
    clip_ratio = metrics[grpo.metric_names.index("clip_ratio")].item()
    assert clip_ratio > 0  # the perturbation moves some tokens past the clip: the 2nd pass is not a ratio-1 step
    theirs = trl_loss(model, scored, grpo.loss.cfg, temperature=0.7)
    assert second.item() / len(PROMPTS) == pytest.approx(theirs, abs=1e-5)
    assert second.item() != pytest.approx(first.item(), abs=1e-6)

    at(grpo, 2)(model, batch())  # the next cycle samples again: a new rollout (the generator moved on)
    assert grpo.stage.buffer[0] is not scored


def test_the_reused_rollouts_round_trip_through_the_checkpoint_state():
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    model = tiny_model().train()
    grpo = objective(tokenizer, GrpoLoss.dapo)
    at(grpo, 0)(model, batch())
    state = grpo.state_dict()
    expected, _ = at(grpo, 1)(model, batch())  # the 2nd pass of the uninterrupted run
    resumed = objective(tokenizer, GrpoLoss.dapo)
    with tempfile.TemporaryDirectory() as out:  # as the checkpointer saves and loads a part (weights_only)
        torch.save(state, Path(out) / "objective.pt")
        resumed.load_state_dict(torch.load(Path(out) / "objective.pt", weights_only=True))
    got, _ = at(resumed, 1)(model, batch())
    assert torch.equal(got, expected)
    assert resumed.stage.trained_steps == grpo.stage.trained_steps == 2


def test_with_gradient_accumulation_each_micro_batch_reuses_its_own_rollout():
    """train.grad_accum=2: the batch plan hands micro-batches A B A B (one step, twice); the 3rd and 4th calls reuse
    A's and B's rollouts, and a micro-batch whose prompts are not the buffered ones is an internal error."""
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    model = tiny_model().train()
    grpo = objective(tokenizer, GrpoLoss.dapo)
    first, second = batch(), batch()
    second["input_ids"][:, 1] += 7  # other prompts in the step's 2nd micro-batch
    second["record_key"] += len(PROMPTS)
    for key in second["record_key"].tolist():
        grpo.stage.table.records[key] = {"prompt": "other"}
    at(grpo, 0, 0)(model, first)
    at(grpo, 0, 1)(model, second)
    a, b = grpo.stage.buffer[0], grpo.stage.buffer[1]
    assert a.prompts != b.prompts
    at(grpo, 1, 0)(model, first)
    at(grpo, 1, 1)(model, second)
    assert grpo.stage.buffer == {0: a, 1: b}
    with pytest.raises(AssertionError, match="the step's prompts changed"):
        at(grpo, 1, 0)(model, second)  # the plan handing the 2nd micro-batch where the 1st's repeat belongs


def test_a_micro_batch_of_fillers_gives_every_parameter_a_zero_gradient():
    """Under DDP a rank whose micro-batch is fillers only must still forward through the wrapper and ready every
    gradient bucket, or a rank with real prompts waits on its all-reduce: the filler loss runs the model and gives
    each trainable parameter a zero gradient (not one parameter only), and counts nothing."""
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    model, grpo = tiny_model().train(), objective(tokenizer, GrpoLoss.grpo)
    fillers = batch()
    fillers["targets"][:] = -100  # no anchor target: every row a filler
    calls = []
    handle = model.register_forward_hook(lambda module, args, out: calls.append(1))
    loss, metrics = at(grpo, 0)(model, fillers)
    loss.backward()
    handle.remove()
    assert calls and float(loss) == 0.0 and not metrics.any()
    grads = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
    assert all(g is not None and not g.any() for g in grads.values()), [n for n, g in grads.items() if g is None]
    assert not list((Path(grpo.stage.completions_path).parent).glob("*.jsonl"))  # nothing generated, nothing written


def test_a_function_is_averaged_over_what_it_scored_and_an_unscored_batch_is_counted_and_said(
    tmp_path, monkeypatch, capsys
):
    """rewards/<fn> is the mean over the completions the function scored (a None is no 0); a micro-batch none of
    whose completions is scored says so in the log and counts in rewards/unscored."""
    (tmp_path / "abstain.py").write_text(
        "def some(completions, **kw):\n"
        "    return [1.0 if i % 2 else None for i in range(len(completions))]\n"
        "def none(completions, **kw):\n"
        "    return [None] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    model = tiny_model().train()
    for name, expected, unscored in (("some", 1.0, 0.5), ("none", 0.0, 1.0)):
        grpo = objective(tokenizer, GrpoLoss.dapo, rewards=(f"abstain.py:{name}",))
        _, metrics = at(grpo, 0)(model, batch())
        got = dict(zip(grpo.metric_names, (metrics / len(PROMPTS)).tolist(), strict=True))
        assert got[f"rewards/{name}"] == pytest.approx(expected) and got["rewards/unscored"] == pytest.approx(unscored)
    assert "no reward function scored any of the micro-batch's 8 completions" in capsys.readouterr().out
