"""The export proof of a scalar head (plan.scored == "scalar": a reward model), called by seqtune.export.proof.

`capture_scores`: the trained model scores the first validation pairs (each sequence cut after its terminator) the
way training reads them (the `targets=` forward of seqtune.models.scalar_head: the score at the terminator).
`prove_scores`: the artifact, loaded with AutoModelForSequenceClassification (adapters on their causal base with one
label), must be the family's ForSequenceClassification with num_labels=1 and a pad_token_id; give the same scores
with its own pooling (one sequence, and the pair right-padded into one batch); and score chosen above rejected on
every pair the trained model does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from seqtune.data.types import IGNORE_INDEX

# Validation pairs scored (chosen and rejected each).
PAIRS = 8


def reference_pairs(run_dir: Path) -> list[tuple[list[list[int]], list[list[int]], str]]:
    """(input ids, labels) of each member of the first validation pairs (the train split's without one), each cut
    after its last target (the terminator), with the chosen member's location."""
    from seqtune.config.plan import load_plan
    from seqtune.data.cache import TokenCache

    plan = load_plan(run_dir)
    cache = TokenCache.open(Path(plan.caches.get("val") or plan.caches["train"]))
    stride = plan.sequences_per_sample
    pairs = []
    for i in range(0, len(cache) - 1, stride):
        members = [cache[i], cache[i + 1]]
        cut = []
        for sample in members:
            targets = (sample.labels != IGNORE_INDEX).nonzero()[0]
            end = int(targets[-1]) + 1 if len(targets) else len(sample.input_ids)
            cut.append((sample.input_ids[:end].tolist(), sample.labels[:end].tolist()))
        if all(len(ids) > 1 for ids, _ in cut):
            pairs.append(([ids for ids, _ in cut], [labels for _, labels in cut], members[0].location))
        if len(pairs) == PAIRS:
            break
    return pairs


@torch.no_grad()
def capture_scores(
    model: torch.nn.Module, run_dir: Path, *, device: torch.device
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """ids.{2p}, ids.{2p+1} (pair p's chosen and rejected) and score.{k}: the trained model's score of each, read
    as training reads it."""
    tensors, locations = {}, []
    for p, (members, labels, location) in enumerate(reference_pairs(run_dir)):
        for j, (ids, member_labels) in enumerate(zip(members, labels, strict=True)):
            k = 2 * p + j
            targets = torch.full((1, len(ids)), IGNORE_INDEX, dtype=torch.long)
            targets[0, :-1] = torch.tensor(member_labels[1:])
            out = model(
                input_ids=torch.tensor([ids], device=device),
                position_ids=torch.arange(len(ids), device=device)[None],
                targets=targets.to(device),
                sequence_index=torch.zeros(1, len(ids), dtype=torch.long, device=device),
                return_dict=True,
            )
            tensors[f"ids.{k}"] = torch.tensor(ids, dtype=torch.int64)
            tensors[f"score.{k}"] = out.logits.float().cpu()[:1].contiguous()
        locations.append(location)
    return tensors, locations


def _config_failures(directory: Path, model: Any) -> tuple[dict[str, Any], list[str]]:
    config = model.config
    architectures = list(config.architectures or [])
    checks = {"architectures": architectures, "num_labels": config.num_labels, "pad_token_id": config.pad_token_id}
    failures = []
    if (
        not any(name.endswith("ForSequenceClassification") for name in architectures)
        and not (directory / "adapter_config.json").is_file()
    ):
        failures.append(f"{directory.name}/config.json architectures={architectures} is no ForSequenceClassification")
    if config.num_labels != 1:
        failures.append(f"num_labels={config.num_labels}, not 1 (one scalar score)")
    if config.pad_token_id is None:
        failures.append("pad_token_id is null: transformers cannot score a padded batch")
    return checks, failures


@torch.no_grad()
def prove_scores(
    model: torch.nn.Module, directory: Path, reference: dict[str, torch.Tensor], tolerance: float, device: torch.device
) -> tuple[dict[str, Any], list[str]]:
    checks, failures = _config_failures(directory, model)
    config: Any = model.config  # a transformers model's config (nn.Module types attributes Tensor | Module)
    pad = config.pad_token_id
    count = len([k for k in reference if k.startswith("score.")])
    expected = torch.cat([reference[f"score.{k}"] for k in range(count)])
    single = torch.stack(
        [
            model(input_ids=reference[f"ids.{k}"][None].to(device), return_dict=True).logits[0, 0].float().cpu()
            for k in range(count)
        ]
    )
    batched = []
    for p in range(count // 2):
        members = [reference[f"ids.{2 * p + j}"] for j in (0, 1)]
        width = max(len(m) for m in members)
        ids = torch.full((2, width), pad if pad is not None else 0, dtype=torch.long)
        mask = torch.zeros(2, width, dtype=torch.long)
        for j, member in enumerate(members):
            ids[j, : len(member)], mask[j, : len(member)] = member, 1
        batched.append(
            model(input_ids=ids.to(device), attention_mask=mask.to(device), return_dict=True).logits[:, 0].float().cpu()
        )
    padded = torch.cat(batched) if batched else single
    scale = max(1.0, float(expected.abs().max())) if count else 1.0
    worst = float((single - expected).abs().max()) / scale if count else 0.0
    worst_padded = float((padded - expected).abs().max()) / scale if count else 0.0
    ours, theirs = single[0::2] > single[1::2], expected[0::2] > expected[1::2]
    checks |= {
        "pairs": count // 2,
        "max_score_difference_relative": round(worst, 8),
        "max_score_difference_padded_batch": round(worst_padded, 8),
        "tolerance": tolerance,
        "chosen_above_rejected": int(ours.sum()),
        "trained_chosen_above_rejected": int(theirs.sum()),
        "scores": [round(float(s), 6) for s in single],
    }
    if worst > tolerance:
        failures.append(f"its scores differ from the trained model's by {worst:.3g} (relative) > {tolerance:g}")
    if worst_padded > tolerance:
        failures.append(
            f"scoring a right-padded batch (pad_token_id={pad}) differs from the trained scores by "
            f"{worst_padded:.3g} > {tolerance:g}: transformers pools at another token than training read"
        )
    missed = [p for p in range(count // 2) if bool(theirs[p]) and not bool(ours[p])]
    if missed:
        failures.append(
            f"it scores rejected above chosen in validation pairs {missed} where the trained model scores chosen "
            f"above rejected (scores {json.dumps(checks['scores'])})"
        )
    return checks, failures
