"""The online stage every online recipe shares (recipe=lora_grpo | lora_rloo ...), set by rollout.*.

Per micro-batch of prompts it samples completions with the current weights (sampling.py), scores them with the
reward functions (rewards.py, proven before step 1 by checks.py), keeps them for the steps that reuse them, and
checkpoints its generators and that buffer (stage.py); completions.jsonl and samples.html show each eval's
(completions.py). The per-token draw runs on the logits' device from a checkpointed device generator (draw.py); a
reward-list entry naming a directory or hf:org/name is a reward model (reward_model.py). A recipe's loss receives one typed value (stage.Rollouts) through objective.OnlineObjective, which
the loop and the evaluator drive by telling it where each micro-batch stands (seqtune.train.objectives.Position).

Layer: above `train` (it reads train's reference models and metrics file helpers); recipes import it; config/ and
data/ never do. This file is torch-free (the preflight checks import the package).
"""
