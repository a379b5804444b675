"""merged/ over a quantized base (QLoRA, or a checkpoint loaded as stored) is the saved adapter merged into the
base loaded as float, not peft's merge into the 4-bit weights (which quantizes the merged weights again). Neither
bitsandbytes nor CUDA is here: a float run's merged/ (peft's merge of the trained model) is what the float path must
reproduce, and the plan's quantized-ness facts are what is varied."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.support.checkpoints import build_checkpoint
from tests.support.cli import run_cli
from tests.support.runs import TRAIN_BRIEFLY, chat_rows

pytestmark = pytest.mark.slow  # one real LoRA run (~15 s), read by every test here


@pytest.fixture(scope="module")
def float_run(tmp_path_factory) -> Path:
    """A LoRA run over a float model.path checkpoint whose merged/ is peft's merge of the trained model."""
    root = tmp_path_factory.mktemp("float_merge")
    checkpoint = build_checkpoint("phi3", root / "phi3")
    run_dir = root / "run"
    result = run_cli(
        [
            "model=hf",
            f"model.path={checkpoint}",
            "data.format=chat",
            f"data.train={chat_rows(root / 'chat.jsonl')}",
            *TRAIN_BRIEFLY,
            "optim.lr=1e-2",  # a delta far above float32's rounding, so an unmerged adapter would show
        ],
        run_dir,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return run_dir


def _facts(run_dir: Path):
    from transformers import AutoTokenizer

    from seqtune.export.facts import ship_facts

    return ship_facts(AutoTokenizer.from_pretrained(run_dir / "adapter"), run_dir)


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {name: t for file in sorted(directory.glob("*.safetensors")) for name, t in load_file(str(file)).items()}


def _assert_same_weights(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_the_float_merge_of_the_saved_adapter_is_peft_merge_of_the_trained_float_model(float_run):
    from seqtune.export.float_merge import float_merged

    facts = _facts(float_run)
    merged = float_merged(facts, float_run / "adapter", device=torch.device("cpu"))
    expected = _weights(float_run / "merged")
    base = _weights(Path(str(facts.cfg.model.path)))
    assert any(not torch.equal(expected[n], base[n]) for n in expected if n in base), "the adapter changed nothing"
    _assert_same_weights({n: t.contiguous() for n, t in merged.state_dict().items() if n in expected}, expected)
    assert merged.dtype == torch.float32 and not any("lora_" in name for name, _ in merged.named_parameters())


class _QuantizedTrainedModel:
    """The trained model over a quantized base: peft's merge into it is what the float path replaces."""

    def merge_and_unload(self):
        raise AssertionError("peft's merge into the quantized base was called")


@pytest.mark.parametrize("quantized", ["none", "qlora", "stored"])
def test_the_export_merges_into_the_float_base_exactly_when_the_plan_says_the_base_is_quantized(
    float_run, tmp_path, capsys, quantized
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from seqtune.train.export import _write_merged

    run_dir = shutil.copytree(float_run, tmp_path / "run")
    expected = _weights(run_dir / "merged")
    shutil.rmtree(run_dir / "merged")
    facts = _facts(run_dir)
    if quantized == "qlora":
        facts = replace(facts, cfg=replace(facts.cfg, model=replace(facts.cfg.model, load_in_4bit=True)))
    elif quantized == "stored":
        facts = replace(facts, checkpoint_load="stored")
    assert facts.quantized_base == (quantized != "none")
    model = _QuantizedTrainedModel() if facts.quantized_base else None
    if model is None:  # the trained float model: peft's merge is the export
        base = AutoModelForCausalLM.from_pretrained(facts.cfg.model.path, dtype=torch.float32)
        model = PeftModel.from_pretrained(base, run_dir / "adapter")
    tokenizer = _tokenizer(run_dir)
    _write_merged(model, tokenizer, facts, [], torch.device("cpu"))  # type: ignore[arg-type]
    said = capsys.readouterr().out
    note = {
        "none": None,
        "qlora": "merged into the float32 base: model.path's own weights",
        "stored": "merged into the dequantized",
    }
    if note[quantized] is None:
        assert "merged into the" not in said
    else:
        assert note[quantized] in said, said
    _assert_same_weights(_weights(run_dir / "merged"), expected)


def _tokenizer(run_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(run_dir / "adapter")
