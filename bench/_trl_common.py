"""Shared by the TRL baselines (bench/_trl_dpo_baseline.py, bench/_trl_sft_baseline.py), run in bench/.venv-trl where
seqtune is not installed: the LoRA, optimizer and schedule of the spec (bench/_vs_trl.py trainer_spec), the settings
both leave off TRL's defaults, and the one line of results the bench reads."""

from __future__ import annotations

import json
import os

import torch
import trl
from _step_times import StepTimes  # bench/ is this script's directory, first on sys.path
from peft import LoraConfig
from transformers import Trainer


def peft_config(spec: dict) -> LoraConfig:
    lora = spec["lora"]
    return LoraConfig(
        r=lora["rank"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=lora["targets"],
        modules_to_save=lora["modules_to_save"] or None,
        task_type="CAUSAL_LM",
    )


def matching_args(spec: dict, out_dir: str) -> dict:
    """TrainingArguments every TRL baseline sets to match the seqtune run."""
    return {
        "output_dir": out_dir,
        "per_device_train_batch_size": spec["batch_size"],
        "gradient_accumulation_steps": 1,
        "max_steps": spec["steps"],
        "learning_rate": spec["lr"],
        "max_grad_norm": spec["grad_clip"],
        "train_sampling_strategy": "sequential",  # seqtune runs with data.shuffle=false: both read in order
        # TRL's own defaults are gradient_checkpointing=True and bf16=True (autocast, on CPU too); seqtune's runs
        # on the CPU have model.gradient_checkpointing=false and fp32 (train.mixed_precision=auto is none on CPU),
        # on CUDA bf16 autocast (bench/gpu/vs_trl.py): the spec carries seqtune's settings.
        "gradient_checkpointing": spec["gradient_checkpointing"],
        "gradient_checkpointing_kwargs": {"use_reentrant": False},  # as seqtune checkpoints (models/build.py)
        "bf16": spec["bf16"],
        # Liger's layer kernels (RMSNorm, SwiGLU, RoPE); TRL keeps its own fused LM head (its fused linear
        # cross-entropy is refused with it), as seqtune keeps its fused loss beside Liger.
        "use_liger_kernel": spec["liger"],
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "use_cpu": spec["device"] == "cpu",
        "dataloader_num_workers": 0,
        "seed": spec["seed"],
        "disable_tqdm": True,
    }


def install_optimizer(trainer: Trainer, spec: dict) -> None:
    """seqtune's optimizer and schedule (its warmup starts at lr/warmup, transformers' at 0), set before train()
    so that Trainer.create_optimizer_and_scheduler keeps them."""
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    trainer.optimizer = torch.optim.AdamW(
        trainable, lr=spec["lr"], betas=tuple(spec["betas"]), eps=spec["eps"], weight_decay=spec["weight_decay"]
    )
    factors = spec["lr_factors"]
    trainer.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
        trainer.optimizer, lambda step: factors[min(step, len(factors) - 1)]
    )


def print_result(trainer: Trainer, timer: StepTimes, *, counts: list, losses: list[float]) -> None:
    """The line the bench parses: BENCH_RESULT {json} (step end times, per-step counts and losses, logs)."""
    logged = [h for h in trainer.state.log_history if "learning_rate" in h]
    result = {
        "begin": timer.begin,
        "step_ends": timer.ends,
        "counts": counts,
        "losses": losses,
        "lrs": [h["learning_rate"] for h in logged],
        "grad_norms": [h.get("grad_norm") for h in logged],
        "log_history": logged,
        "threads": torch.get_num_threads(),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "trl": trl.__version__,
        "pid": os.getpid(),
    }
    print("BENCH_RESULT " + json.dumps(result))
