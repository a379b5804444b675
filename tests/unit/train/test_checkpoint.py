"""The checkpoint component on tiny real objects (a Linear model, AdamW, the LR schedule, a batch plan, a loss
scaler): its schedule, pruning, what counts as the latest checkpoint, exact round trips and refusals with the fix."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from seqtune.config.errors import ConfigError
from seqtune.config.plan import Plan, Vocab, World
from seqtune.config.rundir import MANIFEST, complete_checkpoints, latest_checkpoint
from seqtune.config.schema import OptimConfig, PaddingStrategy, Tail, TrainConfig
from seqtune.data.sampler import DistributedBatchPlan
from seqtune.distributed import DistEnv
from seqtune.train.checkpoint import Checkpointer, Progress
from seqtune.train.optim import build_optimizer, build_scheduler

ENV = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
PLAN = Plan(world=World(nnodes=1, nproc_per_node=1, source="test"), sharded=False, device_type="cpu",
            cuda_available=False, autocast_dtype=None, compute_dtype="float32", loss_scaling=False,
            padding_side="right", context_length=64, num_layers=1, model_type="llama",
            vocab=Vocab(tokenizer_size=8, special_ids={}, pad_id=0, eos_id=1, embedding_rows=8, output_rows=8,
                        resize_to=None))


class Training:
    """Everything a Checkpointer is built from, for one tiny model."""

    def __init__(self, run_dir: Path, *, save_every: int = 2, keep_last: int = 2, scaler: bool = False,
                 width: int = 4, plan: Plan = PLAN, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 1))
        # A frozen parameter (like a LoRA base weight) is never saved: it comes from the base model, the same in
        # every run (zeros here, whatever the seed).
        self.model[0].bias.requires_grad_(False).data.zero_()
        cfg = OptimConfig(lr=0.1, warmup_steps=2)
        self.optimizer = build_optimizer([p for p in self.model.parameters() if p.requires_grad], cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg, total_steps=10)
        self.data = DistributedBatchPlan(np.arange(1, 17), batch_size=2, world_size=1, rank=0,
                                         strategy=PaddingStrategy.longest,
                                         max_seq_len=32, seed=3, shuffle=True, tail=Tail.drop, bucket_window=100)
        self.scaler = torch.amp.GradScaler("cpu") if scaler else None
        self.progress = Progress()
        self.checkpointer = Checkpointer(
            run_dir=run_dir, cfg=TrainConfig(save_every=save_every, keep_last=keep_last),
            plan=replace(plan, loss_scaling=scaler), env=ENV, model=self.model, optimizer=self.optimizer,
            scheduler=self.scheduler, data=self.data, scaler=self.scaler, progress=self.progress)

    def step(self) -> None:
        loss = self.model(torch.randn(3, self.model[0].in_features)).pow(2).sum()
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()
        next(iter(self.data))
        self.progress.step += 1
        self.progress.tokens_seen += 10

    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.step()
            self.checkpointer.maybe_save(self.progress.step)


def saved_steps(run_dir: Path) -> list[int]:
    return [int(p.name[5:]) for p in complete_checkpoints(run_dir)]


def test_saves_on_schedule_and_keeps_the_newest_k(tmp_path):
    run = Training(tmp_path, save_every=2, keep_last=2)
    run.train(7)
    assert saved_steps(tmp_path) == [4, 6]
    latest = latest_checkpoint(tmp_path)
    assert latest.name == "step_00000006"
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_rank0.pt", "data_rank0.pt",
            MANIFEST} == {p.name for p in latest.iterdir()}
    manifest = json.loads((latest / MANIFEST).read_text())
    assert manifest["step"] == 6 and manifest["progress"] == {"step": 6, "tokens_seen": 60}
    assert manifest["plan"]["world"]["nproc_per_node"] == 1  # the plan it was written under


def test_keep_last_zero_keeps_every_checkpoint_and_save_every_zero_saves_none(tmp_path):
    Training(tmp_path / "all", save_every=2, keep_last=0).train(7)
    assert saved_steps(tmp_path / "all") == [2, 4, 6]
    Training(tmp_path / "none", save_every=0).train(4)
    assert saved_steps(tmp_path / "none") == [] and latest_checkpoint(tmp_path / "none") is None


def test_latest_is_the_newest_complete_checkpoint(tmp_path):
    run = Training(tmp_path, save_every=2, keep_last=0)
    run.train(4)
    (tmp_path / "checkpoints" / ".tmp-step_00000006").mkdir()  # a crash mid-save
    (tmp_path / "checkpoints" / "step_00000010").mkdir()  # no manifest: incomplete
    assert latest_checkpoint(tmp_path).name == "step_00000004"


def test_resume_continues_exactly_like_the_uninterrupted_run(tmp_path):
    """Model, Adam moments, LR schedule, loss scaler, data position and RNG (the next random inputs) all come back:
    a run resumed at step 3 with other initial weights and another RNG seed ends at step 5 with the same weights."""
    reference = Training(tmp_path / "ref", save_every=0, scaler=True)
    reference.train(5)
    Training(tmp_path / "run", save_every=3, scaler=True).train(3)
    resumed = Training(tmp_path / "run", save_every=3, scaler=True, seed=1,
                       plan=replace(PLAN, resume_from=str(latest_checkpoint(tmp_path / "run"))))
    assert resumed.checkpointer.resume() is True
    assert (resumed.progress.step, resumed.progress.tokens_seen) == (3, 30)
    resumed.train(2)
    assert resumed.scheduler.state_dict() == reference.scheduler.state_dict()
    assert resumed.scaler.state_dict() == reference.scaler.state_dict()
    assert resumed.data.state_dict() == reference.data.state_dict()
    for a, b in zip(resumed.model.parameters(), reference.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_run_without_a_resume_point_starts_at_step_zero(tmp_path):
    run = Training(tmp_path)
    assert run.checkpointer.resume() is False and run.progress.step == 0


def test_a_checkpoint_of_another_model_is_refused_with_the_fix(tmp_path):
    Training(tmp_path, save_every=2).train(2)
    other = Training(tmp_path, width=6, plan=replace(PLAN, resume_from=str(latest_checkpoint(tmp_path))))
    with pytest.raises(ConfigError, match=r"does not hold this model's trainable parameters.*Fix: train.resume=never"):
        other.checkpointer.resume()


def test_a_checkpoint_missing_a_part_is_refused_naming_it(tmp_path):
    Training(tmp_path, save_every=2).train(2)  # written without fp16: no loss scaler state
    with_scaler = Training(tmp_path, scaler=True, plan=replace(PLAN, resume_from=str(latest_checkpoint(tmp_path))))
    with pytest.raises(ConfigError, match=r"has no scaler state .*Fix: train.resume=never"):
        with_scaler.checkpointer.resume()
