"""Resuming a run: which checkpoint, and whether this run may continue it. Decided once, in the parent, before
anything of the run's record is written (torch-free, like the rest of the parent's early work).

1. `find_resume`: with train.resume=auto, the newest checkpoint whose files match its manifest (sizes, then sha256);
   a damaged newer one is skipped and the console says which and why. Checkpoints exist but none can be used:
   refused, since starting over would truncate the run's metrics.
2. `check_settings` (before config.yaml is written): every setting (`flat_settings`) is compared with the ones the
   checkpoint was written with; any difference not accepted is refused, naming every key with both values.
3. `plan_problems` (preflight, after the scan, before plan.json/preflight.json are written): the same for the
   resolved plan, which holds what the settings alone do not show: the data's content (each split's token cache key),
   the world size the launcher or SLURM gives, max_seq_len=auto, the batch plan, kernels picked by `auto`.

A difference is accepted only when listed in train.resume_accept, and only keys of RESUME_ACCEPTABLE (schema.py) may
be listed: what they change is how long the run goes, what it logs, evaluates, saves and exports, never what a step
computes from the checkpoint's state. A setting whose field declares AFTER_TRAINING (schema.py: the exports) decides
only what is written after the last step: its change is taken unlisted, and said.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from seqtune.config.errors import ConfigError
from seqtune.config.load import after_training_settings, flat_settings
from seqtune.config.plan import Plan
from seqtune.config.rundir import checkpoint_damage, checkpoint_step, complete_checkpoints, read_manifest
from seqtune.config.schema import RESUME_ACCEPTABLE, RESUME_IGNORED, Resume, RootConfig, TrainConfig
from seqtune.preflight.checks import Problem

# Plan fields that explain a difference rather than make one (reasons, where a world size came from), that say where
# rather than what (a split's token cache directory: `data` holds its identity; the rejects file), or that differ on
# every resume (the checkpoint itself).
PLAN_IGNORED = (
    "resume_from",
    "attn_reason",
    "kernels_reason",
    "loss_reason",
    "optimizer_reason",
    "cuda_available",
    "world.source",
    "caches",
    "rejects_file",
)
# Why a plan fact can change while every setting stayed the same.
PLAN_HINTS = {
    "world": "the ranks started: launcher.nnodes x launcher.nproc_per_node, or the SLURM allocation",
    "batches": "the batch plan the data position was saved under",
    "data": "the split's file contents, the tokenizer or the chat template changed",
    "max_seq_len": "data.max_seq_len=auto, resolved over the data",
    "vocab": "the tokenizer or the model's config.json changed",
    "optimizer": "optim.name runs another class on another device (seqtune.models.optimizers); one's state does "
    "not load into the other",
}
RECORD = "config.yaml, plan.json, preflight.json, metrics.jsonl"


@dataclass(frozen=True, kw_only=True)
class ResumePoint:
    """The checkpoint this run continues, with what it was written under (its manifest)."""

    checkpoint: Path
    step: int
    settings: dict[str, Any]
    plan: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Change:
    key: str
    saved: Any
    now: Any

    def __str__(self) -> str:
        return f"{self.key} {_show(self.saved)} -> {_show(self.now)}"


def find_resume(cfg: TrainConfig, run_dir: Path) -> ResumePoint | None:
    """The newest usable checkpoint of `run_dir` (train.resume=auto), or None to start at step 0."""
    if cfg.resume == Resume.never:
        return None
    skipped: list[str] = []
    for path in reversed(complete_checkpoints(run_dir)):
        damage = checkpoint_damage(path)
        if damage is not None:
            skipped.append(f"{path.name}: {damage}")
            print(f"resume: checkpoint {path} cannot be used ({damage}); trying the one before it.", flush=True)
            continue
        if skipped:
            print(
                f"resume: continuing from {path.name}, the newest intact checkpoint (skipped: {'; '.join(skipped)}).",
                flush=True,
            )
        manifest = read_manifest(path)  # its shape was checked with its files (checkpoint_damage)
        return ResumePoint(
            checkpoint=path, step=checkpoint_step(path), settings=manifest["settings"], plan=manifest["plan"]
        )
    if skipped:
        raise ConfigError(
            f"train.resume=auto found checkpoints in {Path(run_dir) / 'checkpoints'}, but none can be used: "
            f"{'; '.join(skipped)}. Nothing was written ({RECORD} are unchanged).",
            key="train.resume",
            fix="start over in a new directory: train.resume=never hydra.run.dir=NEW_DIR",
        )
    return None


def check_settings(point: ResumePoint, cfg: RootConfig) -> None:
    """Refuse (ConfigError) when a setting differs from the checkpoint's and train.resume_accept does not list it
    (a setting declared AFTER_TRAINING, an export's, needs no listing); print the accepted differences."""
    changes = setting_changes(point.settings, cfg)
    exports = [c for c in changes if _covered(c.key, after_training_settings(cfg))]
    refused = [c for c in changes if c not in exports and not accepted(c.key, cfg.train.resume_accept)]
    if refused:
        raise ConfigError(
            _refusal(point, "; ".join(map(str, refused)), len(refused), "setting(s)"),
            key="train.resume",
            fix=_fix(refused),
        )
    listed = [c for c in changes if c not in exports]
    if listed:
        longer = any(c.key in ("train.max_steps", "train.epochs") for c in listed)
        print(
            f"resume: continuing {point.checkpoint.name} with accepted change(s) (train.resume_accept): "
            f"{'; '.join(map(str, listed))}"
            f"{'; the learning-rate schedule is recomputed for the new length' if longer else ''}.",
            flush=True,
        )
    if exports:
        print(
            f"resume: export setting(s) changed since {point.checkpoint.name}, applied to this run's exports after "
            f"its last step (they change nothing a step computes): {'; '.join(map(str, exports))}.",
            flush=True,
        )


def resume_accepts(cfg: RootConfig) -> list[str]:
    """What a resume of `cfg` takes changed: train.resume_accept and every setting declared AFTER_TRAINING."""
    return [*cfg.train.resume_accept, *after_training_settings(cfg)]


def setting_changes(saved: Mapping[str, Any], cfg: RootConfig) -> list[Change]:
    """Every setting of `cfg` that differs from `saved` (a checkpoint's or a finished run's flat_settings), the
    per-invocation ones (RESUME_IGNORED) left out: the one rule by which a run directory's settings are compared."""
    return _differences(saved, flat_settings(cfg), ignored=RESUME_IGNORED)


def plan_problems(point: ResumePoint, plan: Plan, accept: Sequence[str]) -> list[Problem]:
    """The resolved plan against the checkpoint's: one problem naming every fact that differs, not accepted."""
    now = json.loads(json.dumps(asdict(plan)))  # tuples as lists, as the manifest stores them
    changes = [
        Change(key=f"plan.{c.key}", saved=c.saved, now=c.now)
        for c in _differences(_flatten(point.plan), _flatten(now), ignored=PLAN_IGNORED)
    ]
    refused = [c for c in changes if not accepted(c.key, accept)]
    if not refused:
        return []
    groups: dict[str, list[Change]] = {}
    for change in refused:
        groups.setdefault(change.key.split(".")[1], []).append(change)
    listed = "; ".join(
        "; ".join(map(str, group)) + (f" ({PLAN_HINTS[field]})" if field in PLAN_HINTS else "")
        for field, group in groups.items()
    )
    return [
        Problem(
            check="resume",
            key="train.resume",
            location=str(point.checkpoint),
            message=f"{_refusal(point, listed, len(refused), 'fact(s) of the resolved plan')} Fix: {_fix(refused)}",
        )
    ]


def _differences(saved: Mapping[str, Any], now: Mapping[str, Any], *, ignored: Iterable[str]) -> list[Change]:
    # Keys on both sides only: a key the checkpoint's seqtune did not have (a setting added since) has no saved
    # value to differ from, and a changed value of an existing key is what changes the training.
    keys = sorted(set(saved) & set(now))
    return [
        Change(key=k, saved=saved.get(k), now=now.get(k))
        for k in keys
        if saved.get(k) != now.get(k) and not _covered(k, ignored)
    ]


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _covered(key: str, entries: Iterable[str]) -> bool:
    """`key` is one of `entries` or inside one of them (a group name covers its keys)."""
    return any(key == e or key.startswith(f"{e}.") for e in entries)


def accepted(key: str, accept: Sequence[str]) -> bool:
    # A split's data identity in the plan (plan.data.val) is accepted with its setting (data.val).
    setting = key.removeprefix("plan.") if key.startswith("plan.data.") else key
    return _covered(key, accept) or _covered(setting, accept)


def _refusal(point: ResumePoint, listed: str, count: int, what: str) -> str:
    return (
        f"train.resume=auto would continue {point.checkpoint} (step {point.step}), but {count} {what} "
        f"differ from the ones it was written with: {listed}. Resuming would not continue the same training. "
        f"Nothing was written ({RECORD} are unchanged)."
    )


def _fix(changes: list[Change]) -> str:
    keys = [c.key.removeprefix("plan.") if c.key.startswith("plan.data.") else c.key for c in changes]
    start_over = "start over in a new directory: train.resume=never hydra.run.dir=NEW_DIR"
    if all(_covered(k, RESUME_ACCEPTABLE) for k in keys):
        return f"train.resume_accept=[{','.join(dict.fromkeys(keys))}] to continue with the new values; or {start_over}"
    return (
        f"restore the checkpoint's values (before each ->), or {start_over}. Only "
        f"{', '.join(RESUME_ACCEPTABLE)} may change in a resume, each listed in train.resume_accept"
    )


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 80 else f"{text[:77]}..."
