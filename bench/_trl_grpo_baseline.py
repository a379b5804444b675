"""The baseline of bench/grpo_vs_trl.py: TRL's GRPOTrainer with LoRA on the same checkpoint, prompts, group size,
completion length, temperature, reward function, AdamW and learning rates as the seqtune run it is compared with.

Everything comes from the JSON spec grpo_vs_trl.py writes from that run's resolved config and plan; the reward is
loaded from its file by path (plain Python: seqtune need not be importable here). Generation is TRL's own
(transformers `generate`, KV cache, `_generate_single_turn`), timed around that method; the step ends come from a
callback. Prints one line: BENCH_RESULT {json}.

    .venv/bin/python bench/_trl_grpo_baseline.py --spec SPEC.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
import time
from pathlib import Path

import torch
from _step_times import StepTimes  # bench/ is this script's directory, first on sys.path
from _trl_common import install_optimizer, matching_args, peft_config, print_result
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer


class TimedGRPOTrainer(GRPOTrainer):
    """Records the begin and end of each generation (one per step: steps_per_generation=1)."""

    generations: list[tuple[float, float, int, int]]

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        begin = time.perf_counter()
        completion_ids, logprobs = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        tokens = sum(map(len, completion_ids))
        self.generations.append((begin, time.perf_counter(), len(completion_ids), tokens))
        return completion_ids, logprobs


def reward_function(path: str, name: str):
    spec = importlib.util.spec_from_file_location("bench_reward", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", type=Path, required=True)
    args = parser.parse_args()
    spec = json.loads(args.spec.read_text())
    torch.set_num_threads(spec["threads"])
    timer = StepTimes()
    records = [json.loads(line) for line in Path(spec["data"]).read_text().splitlines() if line.strip()]
    grpo = spec["grpo"]
    with tempfile.TemporaryDirectory() as out:
        matching = matching_args(spec, out)
        # TRL's batch counts completions: a step's prompts x num_generations, generated once per step.
        matching["per_device_train_batch_size"] = spec["batch_size"] * grpo["num_generations"]
        matching.pop("train_sampling_strategy")  # GRPO's own RepeatSampler: shuffle_dataset below
        config = GRPOConfig(
            **matching,
            num_generations=grpo["num_generations"],
            max_completion_length=grpo["max_completion_tokens"],
            temperature=grpo["temperature"],
            top_p=grpo["top_p"],
            beta=grpo["beta"],
            epsilon=grpo["epsilon"],
            loss_type=grpo["loss"],
            shuffle_dataset=False,
            steps_per_generation=1,
        )
        trainer = TimedGRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(
                spec["checkpoint"], dtype=torch.float32, attn_implementation=spec["attn_implementation"]
            ),
            reward_funcs=reward_function(*spec["reward"]),
            args=config,
            processing_class=AutoTokenizer.from_pretrained(spec["checkpoint"]),
            peft_config=peft_config(spec),
            train_dataset=Dataset.from_list(records),
        )
        install_optimizer(trainer, spec)
        trainer.generations = []
        trainer.add_callback(timer)
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    print_result(trainer, timer, counts=trainer.generations, losses=losses)


if __name__ == "__main__":
    main()
