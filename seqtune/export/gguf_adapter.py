"""train.export_gguf_adapter: the LoRA adapter as a GGUF adapter file, applied at load time by llama.cpp
(`--lora`) and Ollama (`ADAPTER`), beside the base model's own GGUF file:
- gguf/<run>-base.gguf: the base the adapter was trained on (adapter_config.json's base_model_name_or_path), f16,
  with the trained tokenizer, ids and chat template (the merged file's);
- gguf/<run>-lora.gguf: written as llama.cpp's convert_lora_to_gguf.py writes it: general.type "adapter",
  adapter.type "lora", adapter.lora.alpha, and for each adapted matrix its GGUF name + ".lora_a" (peft's lora_A,
  [rank, in]) and ".lora_b" (lora_B, [out, rank], its rows permuted as the base's q/k rows are), in float32.
  llama.cpp scales each pair by alpha / its own rank, as peft does (alpha / rank; rsLoRA's alpha / sqrt(rank) is
  written as the alpha that gives it). A head trained in full (lora.modules_to_save: lm_head, which the adapter
  holds whole) becomes one more pair of rank = its width: lora_a the identity, lora_b the trained head minus the
  base's, scaled by rank / alpha (stored f16, to keep a large vocabulary's file at the head's own size).
What the format cannot hold is refused naming why: DoRA, per-module ranks or alphas, LoRA biases, a module other
than lm_head trained in full, an embedding resized beyond the base's, and a head tied to the embedding.
The proof (`prove_adapter`) runs the base file with the adapter in llama.cpp against the merged f16 file.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from seqtune.config.errors import ConfigError
from seqtune.export.artifacts import GGUF_DIR, ArtifactProof

ADAPTER_TYPE, BASE_TYPE = "lora", "base"
KEY = "train.export_gguf_adapter"
# The adapter applied to the base must give the merged file's logits within f16 rounding (the base and the merged
# file are both f16; proof.TOLERANCE's float16 bound, relative to max(1, the largest |logit|)).
BOUND = 5e-3


def adapter_refusal(config: dict, base_config: dict, trained_rows: int | None) -> str | None:
    """Why this adapter cannot be a llama.cpp LoRA adapter, or None."""
    saved = set(config.get("modules_to_save") or [])
    if config.get("use_dora"):
        return "a DoRA adapter (llama.cpp's adapters are plain LoRA)"
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        return "per-module ranks or alphas (lora.rank_pattern/alpha_pattern): the file holds one alpha"
    if config.get("lora_bias") or config.get("bias", "none") != "none":
        return "LoRA biases (llama.cpp's adapters hold lora_a and lora_b only)"
    if saved - {"lm_head"}:
        return f"modules trained in full ({', '.join(sorted(saved - {'lm_head'}))}): an adapter holds low-rank pairs"
    if trained_rows and trained_rows != base_config["vocab_size"]:
        return f"the embedding was resized ({base_config['vocab_size']} -> {trained_rows} rows): the base file cannot hold the new rows"
    if "lm_head" in saved and base_config.get("tie_word_embeddings", False):
        return "a head trained apart from the embedding it is tied to in the base (llama.cpp has no output tensor to adapt)"
    return None


def _alpha(config: dict) -> float:
    """The alpha that makes llama.cpp's alpha / rank equal peft's scaling."""
    alpha, rank = float(config["lora_alpha"]), int(config["r"])
    return alpha * math.sqrt(rank) if config.get("use_rslora") else alpha


def export_adapter_gguf(run_dir: Path, *, key: str) -> tuple[Path, Path]:
    """gguf/<run>-base.gguf and gguf/<run>-lora.gguf (module docstring), and the adapter's Modelfile."""
    from transformers import AutoTokenizer

    from seqtune.export.facts import ship_facts
    from seqtune.export.gguf import GgufIds, gguf_path, terminator_ids, write_gguf
    from seqtune.export.modelfile import write_modelfile

    adapter_dir = run_dir / "adapter"
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    base_dir = Path(config["base_model_name_or_path"])
    if not (base_dir / "config.json").is_file():
        raise ConfigError(
            f"{KEY}: the adapter's base {base_dir} is not a local checkpoint directory to write the base file from.",
            key=KEY,
            fix=f"{KEY}=false, or train from a local model.path.",
        )
    base_config = json.loads((base_dir / "config.json").read_text())
    merged_config = json.loads((run_dir / "merged" / "config.json").read_text())
    if refusal := adapter_refusal(config, base_config, merged_config.get("vocab_size")):
        raise ConfigError(f"{KEY}: llama.cpp's LoRA adapter cannot hold {refusal}.", key=KEY, fix=f"{KEY}=false.")
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "merged")
    facts = ship_facts(tokenizer, run_dir)
    eos, eot = terminator_ids(facts.stop.eos)
    ids = GgufIds(bos=facts.stop.bos, eos=eos, eot=eot, pad=facts.stop.pad)
    add_bos = tokenizer.bos_token_id is not None and tokenizer("a")["input_ids"][:1] == [tokenizer.bos_token_id]
    base = gguf_path(run_dir, BASE_TYPE)
    write_gguf(base_dir, base, "f16", ids=ids, add_bos=add_bos, key=key, tokenizer_dir=run_dir / "merged")
    lora = gguf_path(run_dir, ADAPTER_TYPE)
    _write_lora(adapter_dir, base_dir, base_config, config, lora, key=key)
    write_modelfile(lora, key=key, base=base)
    print(f"saved GGUF adapter: {lora} (on {base.name})", flush=True)
    return base, lora


def lora_tensors(adapter_dir: Path, base_dir: Path, config: dict, adapter: dict) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, array) of every lora_a / lora_b the file holds, as convert_lora_to_gguf.py names them."""
    import gguf
    from safetensors import safe_open

    from seqtune.export.gguf import _permute, _read_tensor, _row

    arch = _row(config["model_type"])
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.name), config["num_hidden_layers"])
    n_head = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_head
    pairs: dict[str, dict[str, np.ndarray]] = {}
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), framework="pt") as f:
        for key in f.keys():  # safe_open has no iteration
            match = re.fullmatch(r"base_model\.model\.(.+)\.lora_([AB])\.weight", key)
            if match:
                pairs.setdefault(f"{match.group(1)}.weight", {})[match.group(2)] = f.get_tensor(key).float().numpy()
            elif key == "base_model.model.lm_head.weight":  # trained in full: a pair of rank = its width
                trained = f.get_tensor(key).float().numpy()
                base = _read_tensor(base_dir, "lm_head.weight")
                rank = trained.shape[1]
                pairs["lm_head.weight"] = {
                    "A": np.eye(rank, dtype=np.float16),
                    "B": ((trained - base) * (rank / _alpha(adapter))).astype(np.float16),
                }
    tensors = []
    for name, pair in sorted(pairs.items()):
        b = pair["B"]
        if arch.permute_qk and name.endswith("self_attn.q_proj.weight"):
            b = _permute(b, n_head)
        elif arch.permute_qk and name.endswith("self_attn.k_proj.weight"):
            b = _permute(b, n_kv)
        mapped = names.get_name(name, try_suffixes=(".weight",))
        if mapped is None:
            raise ConfigError(f"{KEY}: {name} has no GGUF name for {arch.name}.", key=KEY, fix=f"{KEY}=false.")
        tensors += [(f"{mapped}.lora_a", pair["A"]), (f"{mapped}.lora_b", b)]
    return tensors


def _write_lora(adapter_dir: Path, base_dir: Path, base_config: dict, adapter: dict, target: Path, *, key: str):
    import gguf

    from seqtune.export.gguf import _row
    from seqtune.files import atomic_output, follow_umask

    arch = _row(base_config["model_type"])
    with atomic_output(target, key=key) as partial:
        writer = gguf.GGUFWriter(str(partial), gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, arch.name)])
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, _alpha(adapter))
        writer.add_name(target.stem)
        for name, data in lora_tensors(adapter_dir, base_dir, base_config, adapter):
            writer.add_tensor(name, np.ascontiguousarray(data))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        follow_umask(partial)


def prove_adapter(path: Path, run_dir: Path, facts: Any, tokenizer: Any, prompts: list[Any]) -> ArtifactProof:
    """The base file with the adapter, run in llama.cpp, against the merged f16 file: the same next-token logits
    within f16 rounding, the same prompt ids as transformers, and generation ending at the trained terminators."""
    from seqtune.config.errors import SeqtuneError
    from seqtune.export.gguf import gguf_path
    from seqtune.export.gguf_run import _distribution, _same_ids, context_for
    from seqtune.llama_cpp import LlamaModel, version

    artifact, base, merged = f"{GGUF_DIR}/{path.name}", gguf_path(run_dir, BASE_TYPE), gguf_path(run_dir, "f16")
    missing = [p.name for p in (base, merged) if not p.is_file()]
    if missing:
        return ArtifactProof(artifact=artifact, ok=False, failures=[f"{', '.join(missing)} missing beside it"])
    try:
        room = context_for(prompts)
        adapted, reference = LlamaModel(base, adapter=path, n_ctx=room), LlamaModel(merged, n_ctx=room)
    except SeqtuneError as exc:
        return ArtifactProof(artifact=artifact, ok=False, failures=[str(exc)])
    with adapted, reference:
        checks: dict[str, Any] = {"engine": version(), "base": base.name, "compared_with": merged.name, "bound": BOUND}
        checks.update(_distribution(adapted, reference, prompts))
        with LlamaModel(base, n_ctx=room) as alone:  # how far the base alone is: what the adapter brings
            without = _distribution(alone, reference, prompts)["max_logit_difference_relative"]
        checks["max_logit_difference_relative_without_adapter"] = without
        checks["prompt_ids_equal"] = _same_ids(adapted, tokenizer, prompts)
        checks["stops"] = {str(t): adapted.is_end(t) for t in facts.stop.eos}
    failures = []
    if checks["max_logit_difference_relative"] > BOUND:
        failures.append(
            f"the base file with the adapter gives logits {checks['max_logit_difference_relative']:.3g} (relative) "
            f"from the merged file's, above {BOUND}"
        )
    if not all(checks["prompt_ids_equal"]):
        failures.append("llama.cpp tokenizes a rendered validation prompt to other ids than transformers")
    failures += [
        f"llama.cpp does not end generation at trained terminator {t}" for t, ok in checks["stops"].items() if not ok
    ]
    checks["summary"] = (
        f"{base.name} + this adapter in llama.cpp: logits within {checks['max_logit_difference_relative']:.2g} of "
        f"{merged.name}'s (bound {BOUND}; the base alone: {without:.2g}), top-1 agreement {checks['top1_agreement']:.0%}"
    )
    return ArtifactProof(artifact=artifact, ok=not failures, checks=checks, failures=failures)


def prove_base(path: Path, tokenizer: Any, prompts: list[Any]) -> ArtifactProof:
    """The adapter's base file: llama.cpp loads it and reads the validation prompts to transformers' ids (what it
    computes is proven with the adapter applied, against the merged file)."""
    from seqtune.config.errors import SeqtuneError
    from seqtune.export.gguf_run import _same_ids, context_for
    from seqtune.llama_cpp import LlamaModel

    artifact = f"{GGUF_DIR}/{path.name}"
    try:
        with LlamaModel(path, n_ctx=context_for(prompts)) as model:
            same = _same_ids(model, tokenizer, prompts)
    except SeqtuneError as exc:
        return ArtifactProof(artifact=artifact, ok=False, failures=[str(exc)])
    failures = [] if all(same) else ["llama.cpp tokenizes a rendered validation prompt to other ids than transformers"]
    summary = "the adapter's base: loads in llama.cpp, prompt ids " + ("equal" if all(same) else "DIFFER")
    return ArtifactProof(
        artifact=artifact, ok=not failures, checks={"summary": summary, "prompt_ids_equal": same}, failures=failures
    )
