"""Online-RL loss parity with TRL on fixed rollouts, one row per setting with the command that trains it: GRPO (every
grpo.loss), GSPO (grpo.importance_sampling_level=sequence) against TRL's GRPOTrainer._compute_loss, and RLOO
against TRL's RLOOTrainer (its advantage lines transcribed, its own _compute_loss called). Every row must agree to
1e-5; the exit status says whether they all do.

  .venv/bin/python bench/rl_parity.py          (TRL 1.16.0 importable: a dev dependency, or PYTHONPATH as below)
  .venv/bin/pip install --no-deps --target /tmp/trl116 trl==1.16.0 && PYTHONPATH=/tmp/trl116 .venv/bin/python bench/rl_parity.py
"""

from __future__ import annotations

import copy
import sys
import tempfile

import torch
import trl
from datasets import Dataset
from grpo_parity import TOKENIZER, C, G, P, parity_rows, rollout, tiny_model
from transformers import AutoTokenizer
from trl import RLOOConfig, RLOOTrainer

from seqtune.recipes.rloo import RlooConfig
from seqtune.recipes.rloo.loss import rloo_loss
from seqtune.rollout.sampling import Rollout, token_logps

BOUND = 1e-5


def _sample(batch: dict[str, torch.Tensor]) -> Rollout:
    return Rollout(
        sequences=torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
        attention_mask=torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1),
        completion_mask=batch["completion_mask"],
        truncated=torch.zeros(P * G, dtype=torch.bool),
        completion_ids=[],
    )


def _trl_rloo(model, batch, old, advantages, cfg: RlooConfig) -> float:
    with tempfile.TemporaryDirectory() as out:
        args = RLOOConfig(
            output_dir=out,
            per_device_train_batch_size=P * G,
            num_generations=G,
            max_completion_length=C,
            beta=0.0,  # the penalty is in the advantages handed in (TRL would load a reference by hub id)
            epsilon=cfg.epsilon,
            epsilon_high=cfg.clip_high,
            use_cpu=True,
            report_to=[],
            bf16=False,
        )
        trainer = RLOOTrainer(
            model=model,
            reward_funcs=lambda prompts, completions, **kw: [0.0] * len(prompts),
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["x"] * (P * G)}),
            processing_class=AutoTokenizer.from_pretrained(TOKENIZER),
        )
    mask = batch["completion_mask"]
    inputs = {k: batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    inputs |= {"old_logps": (old * mask).sum(1), "advantages": advantages}
    trainer.model.train()
    return float(trainer._compute_loss(trainer.model, inputs).detach())


def _trl_advantages(rewards, old, ref, mask, beta: float) -> torch.Tensor:
    """TRL 1.16 RLOOTrainer._generate_and_score_completions' advantage lines, on one process."""
    rewards = rewards - beta * ((old - ref) * mask).sum(-1)
    grouped = rewards.view(-1, G)
    counts = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    baselines = ((torch.nansum(grouped, dim=1, keepdim=True) - grouped) / (counts - 1)).view(-1)
    return torch.nan_to_num(rewards - baselines, nan=0.0)


def rloo_rows() -> list[dict]:
    batch, model = rollout(0), tiny_model(0)
    sample = _sample(batch)
    logps, _ = token_logps(model, sample, C, 1.0)
    noise = torch.Generator().manual_seed(3)
    old = logps.detach() + 0.3 * torch.randn(logps.shape, generator=noise)  # a few updates since generation
    ref = logps.detach() + 0.05 * torch.randn(logps.shape, generator=noise)
    mask = batch["completion_mask"].float()
    rows = []
    for beta, high in ((0.0, None), (0.05, 0.28)):
        cfg = RlooConfig(beta=beta, epsilon_high=high)
        ours, _, _ = rloo_loss(logps, old, batch["rewards"].double(), mask, cfg=cfg, ref_logps=ref, group=G)
        advantages = _trl_advantages(batch["rewards"], old, ref, mask, beta)
        theirs = _trl_rloo(copy.deepcopy(model), batch, old, advantages, cfg)
        command = f"recipe=lora_rloo rloo.beta={beta}" + (f" rloo.epsilon_high={high}" if high else "")
        rows.append({"command": command, "seqtune": float(ours.detach()) / P, "trl": theirs})
    return rows


def main() -> int:
    grpo, _ = parity_rows()
    rows = [
        {
            "command": f"recipe=lora_grpo grpo.loss={r['loss']} grpo.importance_sampling_level="
            f"{r['importance_sampling_level']} grpo.beta={r['beta']}"
            + (f" grpo.epsilon_high={r['epsilon_high']}" if r["epsilon_high"] else "")
            + f" rollout.temperature={r['temperature']}",
            "seqtune": r["seqtune"],
            "trl": r["trl"],
        }
        for r in grpo
    ] + rloo_rows()
    print(f"trl {trl.__version__}, torch {torch.__version__}; {P} prompts x {G} completions of up to {C} tokens")
    print("| command | seqtune | TRL | abs diff |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| `{r['command']}` | {r['seqtune']:.9f} | {r['trl']:.9f} | {abs(r['seqtune'] - r['trl']):.1e} |")
    worst = max(abs(r["seqtune"] - r["trl"]) for r in rows)
    print(f"max |seqtune - trl| = {worst:.2e} ({'ok' if worst <= BOUND else 'FAIL'}: bound {BOUND:g})")
    return 0 if worst <= BOUND else 1


if __name__ == "__main__":
    sys.exit(main())
