"""Reward-model loss parity with TRL's RewardTrainer: PYTHONPATH=<trl> .venv/bin/python bench/reward_loss_vs_trl.py

TRL is no dependency of seqtune: put a TRL on the path (measured with trl 1.16.0, its wheel unpacked, no deps: it
runs on the seqtune venv's torch and transformers). On the same tiny TinyLlama-shaped model (seqtune's
ForSequenceClassification build, seqtune/configs/model/tinyllama_tiny.yaml) and the same pairs:
- TRL: `RewardTrainer.compute_loss` itself (called unbound, its trainer state stubbed), on TRL's batch layout (every
  chosen, then every rejected, right-padded with the pad id, attention mask), the model's own transformers forward
  (pooled at each row's last non-pad token);
- seqtune: the reward objective (seqtune/recipes/reward/objective.py) on a packed micro-batch of the same pairs, the
  score read at each sequence's terminator (seqtune.models.scalar_head), summed and divided by the pairs.
Both with and without the centring term, and with pad id = eos (the score then read before the terminator on both
sides). Prints one JSON line per case and exits 1 when a loss differs by more than 1e-5.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from omegaconf import OmegaConf
from trl import RewardTrainer, __version__

from seqtune.config.schema import ModelConfig
from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.types import IGNORE_INDEX, TokenizedSample
from seqtune.models import build_model
from seqtune.models.scalar_head import install_scalar_head
from seqtune.recipes.reward import SPEC, RewardConfig
from seqtune.recipes.reward.objective import BradleyTerry

REPO = Path(__file__).resolve().parents[1]
EOS = 1
TOLERANCE = 1e-5


def pairs(count: int, seed: int) -> list[tuple[TokenizedSample, TokenizedSample]]:
    rng = np.random.default_rng(seed)

    def member(prompt: np.ndarray) -> TokenizedSample:
        completion = rng.integers(3, 4000, size=int(rng.integers(1, 12)))
        ids = np.concatenate([prompt, completion, [EOS]]).astype(np.int64)
        labels = ids.copy()
        labels[: len(prompt)] = IGNORE_INDEX
        return TokenizedSample(input_ids=ids, labels=labels, location="bench:1")

    out = []
    for _ in range(count):
        prompt = rng.integers(3, 4000, size=int(rng.integers(2, 16)))
        out.append((member(prompt), member(prompt)))
    return out


def trl_loss(model: torch.nn.Module, batch: list[tuple[TokenizedSample, TokenizedSample]], pad: int, center):
    rows = [s.input_ids for s, _ in batch] + [r.input_ids for _, r in batch]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.as_tensor(row), 1
    accelerator = SimpleNamespace(gather_for_metrics=lambda x: x, gather=lambda x: x)
    state = SimpleNamespace(
        model=model,
        args=SimpleNamespace(center_rewards_coefficient=center),
        accelerator=accelerator,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
    )
    loss = RewardTrainer.compute_loss(state, model, {"input_ids": ids, "attention_mask": mask})
    metrics = state._metrics["eval"]
    return float(loss), metrics["accuracy"][0], metrics["margin"][0]


def main() -> int:
    node = OmegaConf.merge(
        OmegaConf.structured(ModelConfig), OmegaConf.load(REPO / "seqtune/configs/model/tinyllama_tiny.yaml")
    )
    cfg = OmegaConf.to_object(node)
    worst = 0.0
    for pad in (2, EOS):
        model = build_model(cfg, attn_implementation="sdpa", scalar_head=True, pad_id=pad).eval()
        install_scalar_head(model)
        for center in (None, 0.01):
            for seed in range(3):
                batch = pairs(4, seed)
                theirs = trl_loss(model, batch, pad, center)
                rule = BatchRule(strategy="packed", batch_size=len(batch), max_seq_len=64, sequences_per_sample=2)
                packed = make_collator(rule, pad_id=pad, padding_side="right")(batch)
                objective = BradleyTerry(cfg=RewardConfig(center_coefficient=center or 0.0), facts=SPEC.loss_facts())
                with torch.no_grad():
                    loss, metrics = objective(model, packed)
                n = int(packed["num_samples"])
                ours = (float(loss) / n, float(metrics[0]) / n, float(metrics[1]) / n)
                diff = max(abs(a - b) for a, b in zip(ours, theirs, strict=True))
                worst = max(worst, diff)
                print(
                    json.dumps(
                        {
                            "trl": __version__,
                            "pad_id": pad,
                            "center": center,
                            "seed": seed,
                            "seqtune": ours,
                            "trl_loss_accuracy_margin": theirs,
                            "max_diff": diff,
                        }
                    )
                )
    print(json.dumps({"worst_difference": worst, "tolerance": TOLERANCE, "ok": worst <= TOLERANCE}))
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
