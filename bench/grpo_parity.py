"""GRPO loss parity with TRL on fixed rollouts: the same tiny model, prompts, completions and rewards fed to seqtune's
loss (seqtune.recipes.grpo.loss) and to TRL's GRPOTrainer._compute_loss; the losses must agree to 1e-5 for
every grpo.loss, with clip-higher and the KL term.

Needs TRL importable beside seqtune (TRL is no seqtune dependency; bench/grpo_vs_trl.py prints these rows too).
With trl 1.16.0 in seqtune's venv, or unpacked into a directory:
  .venv/bin/pip install --no-deps --target /tmp/trl116 trl==1.16.0
  PYTHONPATH=/tmp/trl116 .venv/bin/python bench/grpo_parity.py
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
from pathlib import Path

import torch
import trl
from datasets import Dataset
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

import seqtune
from seqtune.recipes.grpo import GrpoConfig, GrpoLoss
from seqtune.recipes.grpo.loss import group_advantages, surrogate_loss
from seqtune.rollout.sampling import Rollout, token_logps

P, G, C, LP = 3, 4, 6, 5  # prompts, generations, completion length, prompt width (left-padded)
TOKENIZER = Path(seqtune.__file__).parent / "tokenizers" / "assets" / "seqtune-bpe"  # TRL's processing_class


def tiny_model(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).eval()  # eval: no dropout, so both sides see one function


def rollout(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, 256, (P * G, LP), generator=g)
    prompt_mask = torch.ones_like(prompt_ids)
    for p, pad in enumerate((0, 2, 1)):  # left padding, the same prompt for each of its G rows
        prompt_mask[p * G : (p + 1) * G, :pad] = 0
        prompt_ids[p * G : (p + 1) * G] = prompt_ids[p * G]
    completion_ids = torch.randint(3, 256, (P * G, C), generator=g)
    lengths = torch.randint(1, C + 1, (P * G,), generator=g)
    completion_mask = (torch.arange(C)[None] < lengths[:, None]).long()
    rewards = torch.rand(P * G, generator=g)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "rewards": rewards,
    }


def trl_loss(model, ref_model, batch, advantages, cfg: GrpoConfig, temperature: float) -> float:
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=P * G,
            num_generations=G,
            max_completion_length=C,
            loss_type=str(cfg.loss),
            beta=0.0,
            epsilon=cfg.epsilon,
            epsilon_high=cfg.clip_high,
            temperature=temperature,
            importance_sampling_level=str(cfg.importance_sampling_level),
            use_cpu=True,
            report_to=[],
            bf16=False,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=lambda prompts, completions, **kw: [0.0] * len(prompts),
            args=args,
            train_dataset=Dataset.from_dict({"prompt": ["x"] * (P * G)}),
            processing_class=AutoTokenizer.from_pretrained(TOKENIZER),
        )
    trainer.current_gradient_accumulation_steps = 1
    # Built with beta=0 (with beta > 0 TRL loads a reference model by the config's hub id, which a random model has
    # none of); the reference's log-probabilities are handed in below, computed by TRL's own method.
    trainer.beta = cfg.beta
    inputs = {k: batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    inputs["advantages"] = advantages
    inputs["num_items_in_batch"] = batch["completion_mask"].sum().float()
    if cfg.beta:
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        add_fused_lm_head(ref_model, temperature=temperature, cast_lm_head_to_fp32=False)  # as TRL does its own
        with torch.no_grad():
            inputs["ref_per_token_logps"], _, _ = trainer._get_per_token_logps_and_entropies(ref_model, ids, mask, C)
    trainer.model.train()  # TRL's train-mode normalisers (gradient accumulation 1); the model has no dropout
    return float(trainer._compute_loss(trainer.model, inputs).detach())


def seqtune_loss(model, ref_model, batch, advantages, cfg: GrpoConfig, temperature: float) -> float:
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    ro = Rollout(
        sequences=ids,
        attention_mask=mask,
        completion_mask=batch["completion_mask"],
        truncated=torch.zeros(P * G, dtype=torch.bool),
        completion_ids=[],
    )
    logps, _ = token_logps(model, ro, C, temperature)
    ref = token_logps(ref_model, ro, C, temperature)[0].detach() if cfg.beta else None
    loss, _, _ = surrogate_loss(
        logps,
        logps.detach(),
        advantages,
        batch["completion_mask"].float(),
        cfg=cfg,
        ref_logps=ref,
        group=G,
        max_tokens=C,
    )
    return float(loss.detach()) / P  # the loop divides a step's summed loss by its prompts


def parity_rows() -> tuple[list[dict], float]:
    """Every grpo.loss at beta=0 / temperature 1 and at beta=0.04, epsilon_high=0.28, temperature 0.7: the two
    losses on the same fixed rollout, and the largest difference."""
    batch = rollout(0)
    advantages, _ = group_advantages(batch["rewards"], G)
    ref_model = tiny_model(0)
    policy = tiny_model(0)
    with torch.no_grad():  # the policy a few updates away from the reference, so the KL term is not zero
        for p in policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    results, worst = [], 0.0
    cases = [(loss, "token") for loss in GrpoLoss] + [(GrpoLoss.grpo, "sequence")]  # the last: GSPO
    for loss, level in cases:
        for beta, high, temperature in ((0.0, None, 1.0), (0.04, 0.28, 0.7)):
            cfg = GrpoConfig(loss=loss, beta=beta, epsilon_high=high, importance_sampling_level=level)
            ours = seqtune_loss(copy.deepcopy(policy), ref_model, batch, advantages, cfg, temperature)
            theirs = trl_loss(copy.deepcopy(policy), copy.deepcopy(ref_model), batch, advantages, cfg, temperature)
            worst = max(worst, abs(ours - theirs))
            results.append(
                {
                    "loss": str(loss),
                    "importance_sampling_level": level,
                    "beta": beta,
                    "epsilon_high": high,
                    "temperature": temperature,
                    "seqtune": ours,
                    "trl": theirs,
                    "abs_diff": abs(ours - theirs),
                }
            )
    return results, worst


def main() -> int:
    results, worst = parity_rows()
    print(json.dumps({"trl": trl.__version__, "torch": torch.__version__, "results": results}, indent=1))
    print(f"max |seqtune - trl| = {worst:.2e} ({'ok' if worst <= 1e-5 else 'FAIL'}: bound 1e-5)")
    return 0 if worst <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
