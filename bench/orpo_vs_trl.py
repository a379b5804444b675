"""ORPO loss parity vs TRL: python bench/orpo_vs_trl.py [--pairs 32] [--batch 4] [--beta 0.1] [--checkpoint DIR]

seqtune's OddsRatioObjective (seqtune/recipes/orpo/objective.py) against TRL's ORPOTrainer.get_batch_loss_metrics
(bench/_trl_orpo_baseline.py, in bench/.venv-trl, created when missing: TRL is no dependency of seqtune) on the same
batches of the bundled preference pairs, as the same token ids (prompt with bos; completion + eos), with the same
weights: tinyllama_tiny as seqtune builds it (or --checkpoint, e.g. a run's merged/ export), both sides loading the
one Hugging Face checkpoint, eval mode, fp32.

Like with like. Every per-pair quantity is a mean over the batch's pairs on both sides: rewards/*, log_odds_ratio,
log_odds_chosen and the odds-ratio term of the loss (-beta x mean logsigmoid). The SFT term is not the same
quantity: TRL's nll_loss is the cross-entropy over every token of the batch's chosen sequences, the PROMPT tokens
included, averaged over those tokens; seqtune's is the chosen completion's mean token NLL (the paper's L_SFT),
averaged over pairs, which is exactly minus TRL's logps/chosen. So the bench checks
    seqtune loss == TRL loss - TRL nll_loss - TRL logps/chosen       (to 1e-5)
    seqtune nll_loss == -TRL logps/chosen,   and every other metric equal (to 1e-5),
and reports how far TRL's own nll_loss is from seqtune's. Writes bench/results/orpo_vs_trl.json
(orpo_vs_trl_checkpoint.json with --checkpoint).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch
from _common import REPO, write_results
from _vs_trl import child_env, trl_python, trl_result, write_checkpoint
from transformers import AutoModelForCausalLM, AutoTokenizer

from seqtune.data.batching import BatchRule
from seqtune.data.collate import make_collator
from seqtune.data.types import IGNORE_INDEX, TokenizedSample
from seqtune.models.token_loss import install_token_loss
from seqtune.recipes.orpo import ORPO_METRICS, SPEC, OrpoConfig
from seqtune.recipes.orpo.objective import OddsRatioObjective

PAIRS = REPO / "seqtune" / "data" / "assets" / "preference" / "train.jsonl"
TOLERANCE = 1e-5


def token_pairs(tokenizer, count: int) -> list[dict]:
    rows = [json.loads(line) for line in PAIRS.read_text().splitlines()[:count]]
    eos = [tokenizer.eos_token_id]
    return [
        {
            "prompt_ids": tokenizer(r["prompt"]).input_ids,  # with bos
            "chosen_ids": tokenizer(r["chosen"], add_special_tokens=False).input_ids + eos,
            "rejected_ids": tokenizer(r["rejected"], add_special_tokens=False).input_ids + eos,
        }
        for r in rows
    ]


def sample(prompt: list[int], completion: list[int]) -> TokenizedSample:
    ids = np.asarray(prompt + completion, dtype=np.int64)
    labels = ids.copy()
    labels[: len(prompt)] = IGNORE_INDEX
    return TokenizedSample(input_ids=ids, labels=labels, location="bench")


@torch.no_grad()
def seqtune_side(checkpoint: Path, batches: list[list[dict]], beta: float, pad_id: int) -> list[dict]:
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="sdpa").eval()
    install_token_loss(model, path="chunked")
    objective = OddsRatioObjective(cfg=OrpoConfig(beta=beta), facts=SPEC.loss_facts())
    results = []
    for pairs in batches:
        longest = max(len(p["prompt_ids"]) + len(p[m]) for p in pairs for m in ("chosen_ids", "rejected_ids"))
        rule = BatchRule(strategy="longest", batch_size=len(pairs), max_seq_len=longest, sequences_per_sample=2)
        samples = [
            (sample(p["prompt_ids"], p["chosen_ids"]), sample(p["prompt_ids"], p["rejected_ids"])) for p in pairs
        ]
        loss, metrics = objective(model, make_collator(rule, pad_id=pad_id, padding_side="right")(samples))
        # The loop divides the sums by the step's pair count: here, one micro-batch.
        means = dict(zip(ORPO_METRICS, (metrics / len(pairs)).tolist(), strict=True))
        results.append({"loss": float(loss) / len(pairs), "metrics": means})
    return results


def compare(ours: dict, theirs: dict) -> dict:
    t = theirs["metrics"]
    like = {
        "loss": (ours["loss"], theirs["loss"] - t["nll_loss"] - t["logps/chosen"]),
        "nll_loss": (ours["metrics"]["nll_loss"], -t["logps/chosen"]),
        **{name: (ours["metrics"][name], t[name]) for name in ORPO_METRICS if name != "nll_loss"},
    }
    return {
        "max_abs_difference": max(abs(a - b) for a, b in like.values()),
        "pairs": {name: {"seqtune": a, "trl": b} for name, (a, b) in like.items()},
        "trl_loss": theirs["loss"],
        "trl_nll_loss_prompt_included": t["nll_loss"],
        "seqtune_nll_loss": ours["metrics"]["nll_loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--checkpoint", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        checkpoint = args.checkpoint or write_checkpoint(Path(work) / "checkpoint")
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        pairs = token_pairs(tokenizer, args.pairs)
        batches = [pairs[i : i + args.batch] for i in range(0, len(pairs), args.batch)]
        spec = Path(work) / "spec.json"
        spec.write_text(json.dumps({"checkpoint": str(checkpoint), "beta": args.beta, "batches": batches}))
        proc = subprocess.run(
            [str(trl_python()), str(REPO / "bench" / "_trl_orpo_baseline.py"), "--spec", str(spec)],
            capture_output=True,
            text=True,
            env=child_env(2),
        )
        if proc.returncode != 0:
            raise SystemExit(f"TRL failed:\n{proc.stderr[-4000:]}")
        trl = trl_result(proc.stdout)
        ours = seqtune_side(checkpoint, batches, args.beta, tokenizer.pad_token_id)
    rows = [compare(o, t) for o, t in zip(ours, trl["batches"], strict=True)]
    worst = max(r["max_abs_difference"] for r in rows)
    for i, r in enumerate(rows):
        print(
            f"batch {i}: loss seqtune {r['pairs']['loss']['seqtune']:.6f} = TRL like-with-like "
            f"{r['pairs']['loss']['trl']:.6f} (TRL's own loss {r['trl_loss']:.6f}: nll_loss over prompt+chosen "
            f"{r['trl_nll_loss_prompt_included']:.4f} vs completion-only {r['seqtune_nll_loss']:.4f}); "
            f"max |difference| {r['max_abs_difference']:.2e}"
        )
    print(f"TRL {trl['trl']}: {len(rows)} batches of {args.batch} pairs, worst |difference| {worst:.2e}")
    name = "orpo_vs_trl" + ("_checkpoint" if args.checkpoint else "")
    path = write_results(name, {"trl": trl["trl"], "beta": args.beta, "worst": worst, "batches": rows})
    print(f"wrote {path}")
    if worst > TOLERANCE:
        raise SystemExit(f"parity FAILED: {worst:.2e} > {TOLERANCE}")


if __name__ == "__main__":
    main()
