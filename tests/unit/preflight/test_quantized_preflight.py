"""Through run_preflight: a bitsandbytes 4-bit checkpoint (written in the layout bitsandbytes stores) without
bitsandbytes installed is refused with exit 2 at model.path naming the package and its extra, and the memory report
counts its weights as stored (the file's tensors), not as model.dtype parameters."""

from __future__ import annotations

from safetensors import safe_open

from tests.support.checkpoints import build_checkpoint
from tests.support.configs import TINY_MODEL, alpaca, make_cfg, messages, run_failing
from tests.support.data import write_jsonl
from tests.support.models import write_quantized

GIB = 2**30


def test_a_bitsandbytes_checkpoint_is_refused_naming_why_and_estimated_as_stored(tmp_path, monkeypatch):
    from seqtune.models import quantized

    monkeypatch.setattr(quantized, "_installed", lambda package: False)
    checkpoint = build_checkpoint("smollm", tmp_path / "smollm")
    write_quantized(checkpoint, "bnb_4bit")
    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as f:
        stored = sum(f.get_tensor(name).nbytes for name in f.keys())
    train = write_jsonl(tmp_path / "train.jsonl", [alpaca(n, i) for i, n in enumerate([1, 3, 7, 20])])
    by_path = (f"model.path={checkpoint}", "model.family=auto", "tokenizer.source=path", "lora.enabled=true")
    by_path += tuple(f"model.{key}=null" for key in TINY_MODEL if key != "family")
    report = run_failing(make_cfg(tmp_path, train, *by_path), tmp_path / "run", match=r"\[checkpoint\] model.path")
    said = messages(report)
    assert "model.path holds a bitsandbytes 4-bit checkpoint (config.json quantization_config.quant_method=" in said
    assert (
        "which seqtune cannot train over here: transformers loads it (dequantized on cpu) only with bitsandbytes"
        in said
    )
    assert "Fix: install bitsandbytes (seqtune's `cuda` extra" in said
    # The checkpoint is float32 apart from its 4-bit projections, and model.dtype is float32: the weights are the file.
    assert abs(report["memory"]["weights_gib"] - stored / GIB) < 1e-4
    assert [p["key"] for p in report["problems"]] == ["model.path"]


def test_a_pre_quantized_checkpoint_is_not_offered_qlora_as_a_memory_lever(tmp_path, monkeypatch):
    """QLoRA quantizes a float checkpoint while loading and is refused over a quantized one: a GPU plan over an
    FP8 checkpoint is offered every other lever, never model.load_in_4bit=true."""
    from dataclasses import replace

    import transformers

    from seqtune.models import MemoryInputs, get_spec
    from seqtune.models.arch import config_arch
    from seqtune.preflight import levers
    from tests.support.plans import PLAN

    monkeypatch.setattr(levers, "installed", lambda package: True)  # bitsandbytes, as on a CUDA machine
    (tmp_path / "fp8").mkdir()
    (tmp_path / "fp8" / "config.json").write_text('{"quantization_config": {"quant_method": "fp8"}}')
    cfg = make_cfg(tmp_path, tmp_path / "unused.jsonl")
    spec = get_spec("tinyllama")
    arch = config_arch(transformers.LlamaConfig(hidden_size=64, intermediate_size=176))
    inputs = MemoryInputs(
        arch=arch,
        vocab_rows=arch.vocab_size,
        weights_dtype="bfloat16",
        compute_dtype="bfloat16",
        lora_enabled=True,
        lora_rank=8,
        lora_targets=tuple(spec.lora_targets),
        batch_tokens=512,
        seq_len=512,
    )
    cuda = replace(PLAN, device_type="cuda")
    assert "qlora" in [lever.kind for lever in levers.candidate_levers(cfg, cuda, inputs, max_seq_len=512)]
    cfg.model.path = str(tmp_path / "fp8")
    kinds = [lever.kind for lever in levers.candidate_levers(cfg, cuda, inputs, max_seq_len=512)]
    assert "qlora" not in kinds and "offload" in kinds


def test_loading_a_pre_quantized_checkpoint_over_the_host_is_not_offered_qlora():
    from seqtune.preflight.host import HostNeeds, check_host_needs

    for prequantized, offered in ((False, True), (True, False)):
        needs = HostNeeds(loading_gib=64.0, workers=0, per_worker_gib=0.0, ranks=1, prequantized=prequantized)
        (problem,) = check_host_needs(needs, offloaded_gib=0.0, host_memory_gib=40.0)
        assert ("model.load_in_4bit=true" in problem.message) is offered
        assert "preflight.host_memory_gib=GIB" in problem.message


def test_a_checkpoint_loaded_as_stored_goes_straight_onto_the_gpu(tmp_path):
    """plan.checkpoint_load == "stored" on CUDA: the weights load onto the device as QLoRA's do (device_map), so the
    host's loading moment does not hold the model; on the CPU it does."""
    from seqtune.preflight.host import host_needs

    checkpoint = build_checkpoint("smollm", tmp_path / "smollm")
    write_quantized(checkpoint, "bnb_4bit")
    cfg = make_cfg(tmp_path, tmp_path / "unused.jsonl", f"model.path={checkpoint}")

    def loading(device_type: str, stored_load: bool) -> float:
        needs = host_needs(
            cfg, params=10**6, batch_tokens=512, ranks=1, device_type=device_type, stored_load=stored_load
        )
        return needs.loading_gib

    assert loading("cuda", True) < loading("cuda", False) == loading("cpu", True)


def test_a_merged_export_over_a_base_held_quantized_counts_the_float_base_it_loads_on_the_host(tmp_path):
    """QLoRA, or a checkpoint loaded as stored, on CUDA: merged/ is the adapter merged into the base loaded as float
    on the host (seqtune.export.float_merge), counted as that moment; no merged/, or a float base: nothing."""
    from seqtune.preflight.host import HostNeeds, check_host_needs, host_needs, writes_merged

    float_path = build_checkpoint("smollm", tmp_path / "float")
    stored_path = build_checkpoint("smollm", tmp_path / "bnb")
    write_quantized(stored_path, "bnb_4bit")
    params = 10**9

    def merge_gib(path, *overrides: str, stored_load: bool = False, device_type: str = "cuda") -> float:
        cfg = make_cfg(tmp_path, tmp_path / "unused.jsonl", f"model.path={path}", "model.dtype=bfloat16", *overrides)
        quantized = (params, params // 2) if stored_load else (0, 0)
        needs = host_needs(
            cfg,
            params=params,
            batch_tokens=512,
            ranks=2,
            device_type=device_type,
            quantized=quantized,
            stored_load=stored_load,
            merged=writes_merged(cfg),
        )
        return needs.merge_gib

    qlora = merge_gib(float_path, "model.load_in_4bit=true", "train.export_merged=true")
    assert 2 * params / GIB <= qlora < 2 * params / GIB + 0.01  # bf16 parameters, on the main rank only
    assert merge_gib(float_path, "model.load_in_4bit=true", "train.export_gguf=q8_0") == qlora
    assert merge_gib(float_path, "model.load_in_4bit=true", "train.export_gguf_adapter=true") == qlora  # its f16 proof
    stored = merge_gib(stored_path, "train.export_merged=true", stored_load=True)
    assert stored == qlora + params // 2 / GIB  # the stored tensors it reads whole before dequantizing them
    assert merge_gib(float_path, "model.load_in_4bit=true") == 0  # no merged/
    assert merge_gib(float_path, "train.export_merged=true") == 0  # a float base merges on the device
    needs = HostNeeds(loading_gib=1.0, workers=0, per_worker_gib=0.0, ranks=1, merge_gib=qlora)
    (problem,) = check_host_needs(needs, offloaded_gib=0.0, host_memory_gib=1.5)
    fix = "train.export_merged=false, train.export_gguf=null and train.export_gguf_adapter=false"
    assert problem.key == "train.export_merged" and fix in problem.message
