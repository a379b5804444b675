"""Issue 30's mixture-of-experts export: a tiny Qwen3-MoE, Mixtral and OLMoE checkpoint (tests/support/checkpoints.py) train
5 steps by `model.path` (model.family=auto) and write `train.export_gguf=f16`, whose post-flight proof reads every
tensor back with gguf-py (the stacked experts slice by slice against merged/'s per-expert tensors, the expert
counts against config.json); a checkpoint llama.cpp's graph cannot hold is refused before training, by reason.
Qwen3-MoE's and Mixtral's runs are the ones test_auto_family reads (tests/support/moe_runs.py: by `model=hf
model.path`, Qwen3-MoE's experts LoRA-adapted too), trained once per session."""

from __future__ import annotations

import json

import pytest

from tests.support.checkpoints import build_checkpoint
from tests.support.cli import run_cli
from tests.support.moe_runs import SHARED
from tests.support.runs import TRAIN_BRIEFLY, chat_rows

pytestmark = pytest.mark.slow  # runs the real CLI end to end


def _train(kind, tmp_path, *, overrides=None, extra=()):
    checkpoint = build_checkpoint(kind, tmp_path / kind, config_overrides=overrides)
    run_dir = tmp_path / "run"
    result = run_cli(
        [
            f"model.path={checkpoint}",
            "data.format=chat",
            f"data.train={chat_rows(tmp_path / 'chat.jsonl')}",
            *TRAIN_BRIEFLY,
            "train.max_steps=5",
            "train.export_gguf=f16",
            *extra,
        ],
        run_dir,
    )
    return result, run_dir


@pytest.mark.parametrize(
    ("kind", "overrides", "architecture"),
    [
        ("qwen3_moe", None, "qwen3moe"),
        ("mixtral", None, "llama"),
        # OLMoE as it ships: no grouped-query attention (the fixture's 2 kv heads are refused below).
        ("olmoe", {"num_key_value_heads": 4}, "olmoe"),
    ],
)
def test_a_mixture_of_experts_trains_by_model_path_and_exports_gguf_with_the_proof(
    kind, overrides, architecture, tmp_path, moe_runs
):
    import gguf

    if kind in SHARED:  # the run test_auto_family reads too (tests/support/moe_runs.py): the f16 GGUF among its exports
        run_dir, _ = moe_runs(kind)
    else:
        result, run_dir = _train(kind, tmp_path, overrides=overrides)
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    export = json.loads((run_dir / "export.json").read_text())
    assert export["ok"] is True, export
    config = json.loads((run_dir / "merged" / "config.json").read_text())
    (path,) = (run_dir / "gguf").glob("*.gguf")
    reader = gguf.GGUFReader(str(path))
    assert reader.get_field("general.architecture").contents() == architecture
    experts = config.get("num_experts") or config.get("num_local_experts")
    assert reader.get_field(f"{architecture}.expert_count").contents() == experts
    assert reader.get_field(f"{architecture}.expert_used_count").contents() == config["num_experts_per_tok"]
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    ff = config.get("moe_intermediate_size") or config["intermediate_size"]
    for block in range(config["num_hidden_layers"]):
        assert shapes[f"blk.{block}.ffn_gate_inp.weight"] == [config["hidden_size"], experts]
        assert shapes[f"blk.{block}.ffn_gate_exps.weight"] == [config["hidden_size"], ff, experts]
        assert shapes[f"blk.{block}.ffn_up_exps.weight"] == [config["hidden_size"], ff, experts]
        assert shapes[f"blk.{block}.ffn_down_exps.weight"] == [ff, config["hidden_size"], experts]
    proof = {artifact["artifact"]: artifact for artifact in export["artifacts"]}[f"gguf/{path.name}"]
    assert proof["ok"] and "tensors equal to merged/" in proof["checks"]["summary"], proof


def test_a_mixture_of_experts_llama_cpp_cannot_hold_is_refused_before_training(tmp_path):
    """The OLMoE fixture's grouped-query attention: llama.cpp's olmoe k_norm is {n_embd} wide."""
    result, run_dir = _train("olmoe", tmp_path)
    text = result.stdout + result.stderr
    assert result.returncode == 2, text[-4000:]
    assert "train.export_gguf" in text and "num_key_value_heads 2 != num_attention_heads 4" in text, text[-3000:]
    assert "Traceback" not in text and not (run_dir / "adapter").exists()
