"""What a trained run's exports must prove, checked with the consumers' own loaders (peft, transformers)."""

from __future__ import annotations

from pathlib import Path


def assert_adapter_matches_merged(run_dir: Path, *, seq: int = 16) -> None:
    """The run's adapter on a freshly built base (seeded: the same random base as training) gives the logits of
    its merged export loaded with plain transformers, and differs from the untrained base."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from seqtune.config import load_resolved
    from seqtune.models import build_model

    cfg = load_resolved(run_dir / "config.yaml")
    base = build_model(cfg.model, attn_implementation="sdpa")
    ids = torch.randint(0, cfg.model.vocab_size, (2, seq), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base_logits = base(input_ids=ids, use_cache=False).logits
        tuned = PeftModel.from_pretrained(base, run_dir / "adapter").eval()
        adapter_logits = tuned(input_ids=ids, use_cache=False).logits
        merged = AutoModelForCausalLM.from_pretrained(run_dir / "merged").eval()
        merged_logits = merged(input_ids=ids, use_cache=False).logits
    assert not torch.allclose(base_logits, adapter_logits, atol=1e-4), "training changed nothing"
    torch.testing.assert_close(adapter_logits, merged_logits, atol=1e-4, rtol=1e-4)
