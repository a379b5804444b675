"""The four tiny checkpoints of architectures no named family covers (tests/support/checkpoints.py) train through
`model=hf model.path=DIR` (model.family=auto) with no family named: preflight, a few steps, the adapter and the
merged model exported and loadable with plain transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.checkpoints import KINDS, build_checkpoint
from tests.support.cli import read_metrics, run_cli
from tests.support.moe_runs import EXPERT_LORA, SHARED
from tests.support.runs import TRAIN_BRIEFLY, chat_rows

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

# GPT-2's learned absolute positions: it trains packed, its position ids restarting per document.
PADDING = {"gpt2": "packed"}


def _trained(kind: str, tmp_path, moe_runs) -> tuple[Path, Path, str]:
    """(run directory, checkpoint, what the run printed): the shared run test_moe_gguf reads too (its f16 GGUF
    export beside), or this test's own."""
    if kind in SHARED:
        run_dir, checkpoint = moe_runs(kind)
        return run_dir, checkpoint, (run_dir / "seqtune.log").read_text()
    checkpoint = build_checkpoint(kind, tmp_path / kind)
    moe = "num_experts_per_tok" in json.loads((checkpoint / "config.json").read_text())
    run_dir = tmp_path / "run"
    result = run_cli(
        [
            "model=hf",
            f"model.path={checkpoint}",
            "data.format=chat",
            f"data.train={chat_rows(tmp_path / 'chat.jsonl')}",
            *TRAIN_BRIEFLY,
            *(["train.max_steps=5", "train.log_every=1"] if moe else []),
            *([f"padding={PADDING[kind]}"] if kind in PADDING else []),
            *([f"lora.target_parameters=[{','.join(EXPERT_LORA[kind])}]"] if kind in EXPERT_LORA else []),
        ],
        run_dir,
    )
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    return run_dir, checkpoint, text


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_checkpoint_trains_and_exports_with_no_family_named(kind, tmp_path, moe_runs):
    """A mixture of experts (qwen3_moe, mixtral) trains 5 steps with the router's load-balancing loss, its
    coefficient the checkpoint's, logged as router_aux_loss."""
    from transformers import AutoModelForCausalLM

    run_dir, checkpoint, text = _trained(kind, tmp_path, moe_runs)
    config = json.loads((checkpoint / "config.json").read_text())
    moe = "num_experts_per_tok" in config
    assert "note: model facts (end of turn)" in text and "note: model facts (LoRA targets)" in text
    plan = json.loads((run_dir / "plan.json").read_text())
    adapter = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    assert sorted(adapter["target_modules"]) == sorted(plan["lora_targets"])
    assert sorted(adapter["target_parameters"] or []) == sorted(EXPERT_LORA.get(kind, []))
    merged = AutoModelForCausalLM.from_pretrained(run_dir / "merged")
    assert type(merged).__name__ == config["architectures"][0]
    assert json.loads((run_dir / "export.json").read_text())["ok"] is True
    metrics = read_metrics(run_dir)
    if moe:
        assert plan["router_aux_loss_coef"] == config["router_aux_loss_coef"]
        assert [m["step"] for m in metrics if "router_aux_loss" in m] == [1, 2, 3, 4, 5]
        assert all(m["router_aux_loss"] > 0 for m in metrics if "router_aux_loss" in m)
    else:
        assert plan["router_aux_loss_coef"] is None and not any("router_aux_loss" in m for m in metrics)


def test_a_bare_model_path_trains_with_no_model_named(tmp_path):
    """`model.path=DIR` alone (no model=, no lora=): the run composes model=hf and lora=default, says so, and
    trains the Phi-3-style checkpoint with every fact read from it."""
    checkpoint = build_checkpoint("phi3", tmp_path / "phi3")
    run_dir = tmp_path / "run"
    briefly = [arg for arg in TRAIN_BRIEFLY if not arg.startswith("lora=")]
    args = [f"model.path={checkpoint}", "data.format=chat", f"data.train={chat_rows(tmp_path / 'chat.jsonl')}"]
    result = run_cli([*args, *briefly], run_dir)
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-4000:]
    assert f"model.path={checkpoint} with no model named: model=hf lora=default" in text
    assert "note: model facts (architecture): Phi3ForCausalLM" in text
    config = (run_dir / "config.yaml").read_text()
    assert "family: auto" in config and "modules_to_save: []" in config
    assert json.loads((run_dir / "export.json").read_text())["ok"] is True
