"""Held-out pair accuracy of a KTO run on the bundled demo: python bench/kto_demo_accuracy.py RUN_DIR

The bundled unpaired set is the bundled preference pairs unpaired (scripts/make_unpaired_data.py), so each
validation prompt has a desirable and an undesirable completion. KTO never sees them as pairs; this script asks
whether its implicit reward, beta x (log pi(y|x) - log pi_ref(y|x)) with the reference = the adapters disabled,
ranks the desirable completion above the undesirable one (chance: 0.5), the measure DPO's rewards/accuracies gives.
Before training the adapter is the identity (LoRA's B = 0): every reward is 0 and no pair is ranked.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch
from peft import PeftModel

from seqtune.config.load import load_resolved
from seqtune.config.plan import load_plan
from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.formats import LineParser
from seqtune.data.kinds.unpaired import LABEL
from seqtune.data.tokenize import SampleEncoder
from seqtune.models import build_model, get_spec
from seqtune.models.token_loss import install_token_loss
from seqtune.tokenizers import load_tokenizer
from seqtune.train.objectives import sequence_logps

VAL = Path(__file__).resolve().parents[1] / "seqtune" / "data" / "assets" / "unpaired" / "val.jsonl"


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args()
    cfg, plan = load_resolved(args.run_dir / "config.yaml"), load_plan(args.run_dir)
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=get_spec(cfg.model.family).chat_template)
    encoder = SampleEncoder(tokenizer, "unpaired_preference", train_on_prompt=False)
    lines = VAL.read_text(encoding="utf-8").splitlines()
    records = [LineParser(fmt=encoder.fmt, file=str(VAL)).parse(n, line.encode()) for n, line in enumerate(lines, 1)]
    samples = encoder.encode_batch(records)
    model = PeftModel.from_pretrained(build_model(cfg.model, attn_implementation="sdpa"), args.run_dir / "adapter")
    install_token_loss(model, path=plan.loss)
    model.eval()
    longest = max(len(seq) for sample in samples for seq in sample)
    rule = BatchRule(strategy="longest", batch_size=8, max_seq_len=longest, sequences_per_sample=2, fields=(LABEL,))
    collate = make_collator(rule, pad_id=plan.tokens.pad_id, padding_side="right")
    logratios = []
    for i in range(0, len(samples), 8):
        batch = collate(samples[i : i + 8])
        policy = sequence_logps(model, batch)[0][0::2]
        with model.disable_adapter():
            reference = sequence_logps(model, batch)[0][0::2]
        logratios += (policy - reference).tolist()
    by_prompt: dict[str, dict[bool, float]] = defaultdict(dict)
    for record, logratio in zip(records, logratios, strict=True):
        by_prompt[record.example.prompt][record.label] = logratio
    pairs = [sides for sides in by_prompt.values() if len(sides) == 2]
    accuracy = sum(sides[True] > sides[False] for sides in pairs) / len(pairs)
    print(json.dumps({"run_dir": str(args.run_dir), "pairs": len(pairs), "pair_accuracy": accuracy}))


if __name__ == "__main__":
    main()
