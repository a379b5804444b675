"""Tiny preference batches for objective tests: a tiny LoRA model, (chosen, rejected) pairs collated as a recipe's, each sequence's log-probability computed alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from seqtune.config.schema import LoraConfig, ModelConfig
from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.types import IGNORE_INDEX, TokenizedSample
from seqtune.models import apply_lora, build_model, get_spec
from seqtune.models.token_loss import install_token_loss

CONFIGS = Path(__file__).resolve().parents[2] / "seqtune/configs/model"


def tiny_model(lora: bool = True) -> torch.nn.Module:
    node = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(CONFIGS / "tinyllama_tiny.yaml"))
    model = build_model(OmegaConf.to_object(node), attn_implementation="sdpa")
    if lora:
        model = apply_lora(model, LoraConfig(rank=4, alpha=8), targets=get_spec("tinyllama").lora_targets, saved=())
        # A trained-looking adapter: LoRA's B starts at zero, which would make policy == reference.
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    install_token_loss(model, path="chunked", chunk=7)
    return model.train()


def seq(prompt: list[int], completion: list[int], loc: str) -> TokenizedSample:
    ids = np.asarray(prompt + completion, dtype=np.int64)
    labels = ids.copy()
    labels[: len(prompt)] = IGNORE_INDEX
    return TokenizedSample(input_ids=ids, labels=labels, location=loc)


PAIRS = [
    (seq([1, 5, 6, 7], [9, 10, 2], "p:1"), seq([1, 5, 6, 7], [11, 2], "p:1")),
    (seq([1, 8, 8], [12, 13, 14, 15, 2], "p:2"), seq([1, 8, 8], [16, 2], "p:2")),
]


def batch_of(strategy: str, pairs=PAIRS, batch_size: int = 2) -> dict[str, torch.Tensor]:
    rule = BatchRule(strategy=strategy, batch_size=batch_size, max_seq_len=8, sequences_per_sample=2)
    return make_collator(rule, pad_id=0, padding_side="right")(pairs)


def reference_logps(model: torch.nn.Module, sequence: TokenizedSample) -> float:
    """Sum of log p(target) with plain full logits, the sequence alone."""
    ids = torch.as_tensor(sequence.input_ids).unsqueeze(0)
    logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    wanted = torch.as_tensor(sequence.labels[1:])
    keep = wanted != IGNORE_INDEX
    return float(-F.cross_entropy(logits[keep], wanted[keep], reduction="sum"))
