"""The checkpoint component on tiny real objects (a Linear model, AdamW, the LR schedule, a batch plan, a loss
scaler): its schedule, pruning, what counts as the latest checkpoint, exact round trips and refusals with the fix;
the manifest's sizes and checksums, the fallback past a damaged checkpoint, modes, and a full disk."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from seqtune.config.errors import ConfigError, StorageError
from seqtune.config.plan import Plan
from seqtune.config.rundir import (
    MANIFEST,
    checkpoint_damage,
    checkpoint_files,
    complete_checkpoints,
)
from seqtune.config.schema import OptimConfig, PaddingStrategy, Tail, TrainConfig
from seqtune.data.batching import BatchRule
from seqtune.data.sampler import DistributedBatchPlan
from seqtune.distributed import DistEnv
from seqtune.models.optimizers import TORCH_ADAMW
from seqtune.preflight.resume import find_resume
from seqtune.train.checkpoint import Checkpointer, Progress, load_weights_only
from seqtune.train.optim import build_optimizer, build_scheduler
from tests.support.plans import PLAN

ENV = DistEnv(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


def latest_checkpoint(run_dir: Path) -> Path | None:
    done = complete_checkpoints(run_dir)
    return done[-1] if done else None


class Training:
    """Everything a Checkpointer is built from, for one tiny model."""

    def __init__(
        self,
        run_dir: Path,
        *,
        save_every: int = 2,
        keep_last: int = 2,
        scaler: bool = False,
        width: int = 4,
        plan: Plan = PLAN,
        seed: int = 0,
    ) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 1))
        # A frozen parameter (like a LoRA base weight) is never saved: it comes from the base model, the same in
        # every run (zeros here, whatever the seed).
        self.model[0].bias.requires_grad_(False).data.zero_()
        cfg = OptimConfig(lr=0.1, warmup_steps=2)
        self.optimizer = build_optimizer([p for p in self.model.parameters() if p.requires_grad], cfg, TORCH_ADAMW)
        self.scheduler = build_scheduler(self.optimizer, cfg, total_steps=10)
        self.data = DistributedBatchPlan(
            np.arange(1, 17),
            rule=BatchRule(strategy=PaddingStrategy.longest, batch_size=2, max_seq_len=32),
            world_size=1,
            rank=0,
            seed=3,
            shuffle=True,
            tail=Tail.drop,
            bucket_window=100,
        )
        self.scaler = torch.amp.GradScaler("cpu") if scaler else None
        self.progress = Progress()
        self.checkpointer = Checkpointer(
            run_dir=run_dir,
            cfg=TrainConfig(save_every=save_every, keep_last=keep_last),
            plan=replace(plan, loss_scaling=scaler),
            env=ENV,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            data=self.data,
            scaler=self.scaler,
            progress=self.progress,
            settings={"train.seed": seed},
        )

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
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_rank0.pt", "data_rank0.pt", MANIFEST} == {
        p.name for p in latest.iterdir()
    }
    manifest = json.loads((latest / MANIFEST).read_text())
    assert manifest["step"] == 6 and manifest["progress"] == {"step": 6, "tokens_seen": 60, "first_loss": None}
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
    resumed = Training(
        tmp_path / "run",
        save_every=3,
        scaler=True,
        seed=1,
        plan=replace(PLAN, resume_from=str(latest_checkpoint(tmp_path / "run"))),
    )
    assert resumed.checkpointer.resume() is True
    assert (resumed.progress.step, resumed.progress.tokens_seen) == (3, 30)
    resumed.train(2)
    assert resumed.scheduler.state_dict() == reference.scheduler.state_dict()
    assert resumed.scaler.state_dict() == reference.scaler.state_dict()
    assert resumed.data.state_dict() == reference.data.state_dict()
    for a, b in zip(resumed.model.parameters(), reference.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_run_without_a_resume_point_starts_at_step_zero(tmp_path):
    run = Training(tmp_path)
    assert run.checkpointer.resume() is False and run.progress.step == 0


def test_a_checkpoint_of_another_model_is_refused_with_the_fix(tmp_path):
    Training(tmp_path, save_every=2).train(2)
    other = Training(tmp_path, width=6, plan=replace(PLAN, resume_from=str(latest_checkpoint(tmp_path))))
    with pytest.raises(ConfigError, match=r"does not hold this model's trainable parameters.*Fix: .*resume=never"):
        other.checkpointer.resume()


def test_a_checkpoint_missing_a_part_is_refused_naming_it(tmp_path):
    Training(tmp_path, save_every=2).train(2)  # written without fp16: no loss scaler state
    with_scaler = Training(tmp_path, scaler=True, plan=replace(PLAN, resume_from=str(latest_checkpoint(tmp_path))))
    with pytest.raises(ConfigError, match=r"has no scaler state .*Fix: .*train.resume=never"):
        with_scaler.checkpointer.resume()


# --- integrity: the manifest lists every file with its size and sha256 ---------------------------------------


def test_the_manifest_lists_every_file_with_its_size_and_checksum(tmp_path):
    Training(tmp_path, save_every=2).train(2)
    latest = latest_checkpoint(tmp_path)
    manifest = json.loads((latest / MANIFEST).read_text())
    on_disk = {p.name for p in latest.iterdir()} - {MANIFEST}
    assert set(manifest["files"]) == on_disk
    for name, entry in manifest["files"].items():
        data = (latest / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert manifest["settings"] == {"train.seed": 0}  # what a resume compares its own settings with
    assert checkpoint_damage(latest) is None


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda c: _truncate(c / "model.safetensors"), r"model\.safetensors is [\d,]+ bytes, its manifest says [\d,]+"),
        (lambda c: _flip_byte(c / "optimizer.pt"), r"optimizer\.pt does not match its sha256"),
        (lambda c: (c / "rng_rank0.pt").unlink(), r"rng_rank0\.pt is missing"),
        (lambda c: _truncate(c / MANIFEST), r"manifest\.json cannot be read"),
    ],
)
def test_a_damaged_checkpoint_is_found_and_named_before_use(tmp_path, damage, reason):
    Training(tmp_path, save_every=2).train(2)
    latest = latest_checkpoint(tmp_path)
    damage(latest)
    assert re.search(reason, checkpoint_damage(latest))


def _edit_manifest(checkpoint: Path, edit) -> None:
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    edit(manifest)
    (checkpoint / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda m: m["files"].update({"optimizer.pt": 7}), r"files\['optimizer\.pt'\] is 7, not \{"),
        (lambda m: m["files"]["optimizer.pt"].update(size="12"), r"files\['optimizer\.pt'\] is .*not \{"),
        (
            lambda m: m["files"].update({"../../etc/passwd": {"size": 1, "sha256": "0" * 64}}),
            r"'files' names '\.\./\.\./etc/passwd', outside the checkpoint",
        ),
        (lambda m: m.update(files={}), r"'files' lists no file"),
        (lambda m: m.update(progress=[6, 60]), r"'progress' is \[6, 60\], not an object"),
        (lambda m: m["progress"].update(step=True), r"progress\.step is true, not a count"),
        (lambda m: m.update(parts=[1, 2]), r"'parts' is \[1, 2\], not a list of names"),
        (lambda m: m.update(settings=3), r"'settings' is 3, not an object"),
        (lambda m: m.pop("plan"), r"it has no 'plan'"),
        (lambda m: m.update(step=m["step"] + 1), r"it says step \d, in step_0000000\d"),
    ],
)
def test_a_manifest_of_the_wrong_shape_makes_its_checkpoint_damaged_not_a_traceback(tmp_path, edit, reason):
    """The manifest is checked against its schema before any field is read: resume skips it like a corrupt one."""
    Training(tmp_path, save_every=2, keep_last=0).train(4)
    first, latest = complete_checkpoints(tmp_path)
    _edit_manifest(first, edit)
    assert re.search(r"its manifest\.json is damaged: " + reason, checkpoint_damage(first))
    _edit_manifest(latest, edit)
    with pytest.raises(ConfigError, match=r"none can be used: step_00000004: its manifest\.json is damaged"):
        find_resume(TrainConfig(), tmp_path)


def test_a_pickle_that_calls_a_function_is_refused_by_name_and_never_run(tmp_path):
    """weights_only=True blocks it; the user sees which file and why, not torch's traceback (whose advice is to
    load it with weights_only=False)."""
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    Training(tmp_path, save_every=2).train(2)
    latest = latest_checkpoint(tmp_path)
    with open(latest / "rng_rank0.pt", "wb") as f:
        torch.save({"torch": Payload()}, f)
    _edit_manifest(latest, lambda m: m.update(files=checkpoint_files(latest)))  # a consistent, hostile checkpoint
    resumed = Training(
        tmp_path, save_every=2, plan=replace(PLAN, resume_from=str(find_resume(TrainConfig(), tmp_path).checkpoint))
    )
    with pytest.raises(
        ConfigError,
        match=r"checkpoint file .*step_00000002/rng_rank0\.pt is not a weights-only torch "
        r"file \(.*GLOBAL posix\.system.*\): it is refused unread.*Fix: remove "
        r".*step_00000002",
    ) as info:
        resumed.checkpointer.resume()
    assert info.value.exit_code == 2 and "weights_only=False" not in str(info.value)
    assert not marker.exists()
    (latest / "optimizer.pt").write_bytes(b"not a torch file")
    with pytest.raises(ConfigError, match=r"optimizer\.pt is not a weights-only torch file"):
        load_weights_only(latest / "optimizer.pt")


def test_resume_falls_back_to_the_newest_intact_checkpoint_and_says_so(tmp_path, capsys):
    Training(tmp_path, save_every=2, keep_last=0).train(6)
    checkpoints = complete_checkpoints(tmp_path)
    _truncate(checkpoints[2] / "model.safetensors")  # step 6: cut short
    _flip_byte(checkpoints[1] / "scheduler.pt")  # step 4: a flipped byte, same size
    point = find_resume(TrainConfig(), tmp_path)
    assert point.checkpoint == checkpoints[0] and point.step == 2
    out = capsys.readouterr().out
    assert re.search(r"step_00000006 cannot be used \(model\.safetensors is .* bytes", out)
    assert re.search(r"step_00000004 cannot be used \(scheduler\.pt does not match its sha256", out)
    assert "continuing from step_00000002, the newest intact checkpoint" in out
    assert find_resume(TrainConfig(resume="never"), tmp_path) is None


def test_no_intact_checkpoint_is_refused_rather_than_starting_over(tmp_path):
    """Starting at step 0 in a run directory that trained would truncate its metrics: refuse, naming each one."""
    Training(tmp_path, save_every=2, keep_last=0).train(4)
    for checkpoint in complete_checkpoints(tmp_path):
        _truncate(checkpoint / "optimizer.pt")
    with pytest.raises(
        ConfigError,
        match=r"none can be used: step_00000004: optimizer\.pt is .*step_00000002: "
        r"optimizer\.pt .*Fix: start over in a new directory: train\.resume=never",
    ):
        find_resume(TrainConfig(), tmp_path)


def test_a_resumed_run_replaces_the_damaged_newer_checkpoints(tmp_path):
    """Resumed from step 2 because steps 4 and 6 were damaged: the next save removes them, so they neither outlive
    good checkpoints under keep_last nor get tried again."""
    Training(tmp_path, save_every=2, keep_last=0).train(6)
    for checkpoint in complete_checkpoints(tmp_path)[1:]:
        _truncate(checkpoint / "model.safetensors")
    resumed = Training(
        tmp_path,
        save_every=3,
        keep_last=0,
        plan=replace(PLAN, resume_from=str(find_resume(TrainConfig(), tmp_path).checkpoint)),
    )
    assert resumed.checkpointer.resume() is True
    resumed.train(1)
    assert saved_steps(tmp_path) == [2, 3]


# --- writing: modes, a full disk ------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_checkpoint_files_follow_the_umask(tmp_path, umask):
    """safetensors writes 0600 whatever the umask: a teammate who can read the run directory could not load it."""
    old = os.umask(umask)
    try:
        Training(tmp_path, save_every=2).train(2)
    finally:
        os.umask(old)
    latest = latest_checkpoint(tmp_path)
    assert stat.S_IMODE(latest.stat().st_mode) == 0o777 & ~umask
    for path in latest.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path.name


def test_a_full_disk_while_saving_says_so_keeps_the_previous_checkpoint_and_removes_the_temporary(small_disk):
    run = Training(small_disk.path, save_every=2, keep_last=0)
    run.train(2)
    small_disk.fill()
    with pytest.raises(
        StorageError,
        match=rf"hydra\.run\.dir: no space left on {small_disk.path}/checkpoints/"
        r"(\.tmp-)?step_00000004.* Fix: free space on that disk",
    ):
        run.train(2)
    assert saved_steps(small_disk.path) == [2]
    assert checkpoint_damage(latest_checkpoint(small_disk.path)) is None
    assert [p.name for p in (small_disk.path / "checkpoints").iterdir()] == ["step_00000002"]


def test_a_full_disk_under_fsdp_is_reported_like_any_other(small_disk, tmp_path):
    """torch.distributed.checkpoint wraps every rank's failure in a CheckpointException (a BaseException): the full
    disk inside it is what the user is told about (a process group of one rank, FSDP2 on CPU)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from seqtune.train.checkpoint import ShardedModelAndOptimizer

    if not small_disk.mounted:  # the injected ENOSPC stream is not a file DCP's writer can use
        pytest.skip("needs a real full filesystem (root may mount a tmpfs)")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1))
        fully_shard(model)
        part = ShardedModelAndOptimizer(model, torch.optim.AdamW(model.parameters()))
        small_disk.fill()
        with pytest.raises(OSError) as info:
            part.save(small_disk.path, "model", ENV)
        assert info.value.errno == errno.ENOSPC
    finally:
        dist.destroy_process_group()
