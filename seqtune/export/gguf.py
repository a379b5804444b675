"""GGUF export (llama.cpp, Ollama, LM Studio) with the `gguf` package, no llama.cpp build: the merged model's
tensors (or model/'s for a full fine-tune), the tokenizer (vocabulary, token types, scores or merges), the chat
template trained with and the bos/eos/eot/pad ids, in one RUN_DIR/gguf/<run>-<type>.gguf.

Follows llama.cpp's convert_hf_to_gguf.py for each architecture it knows: a family's `GgufRow` (its `gguf` in
seqtune/models/families/<family>.py, read through the registry by model_type: the tensor names come from gguf's own
TensorNameMap; Llama-layout q/k projections are permuted to llama.cpp's rotary layout; Gemma's RMSNorm weights are
stored as 1 + w). A model_type no family gives a row, or a rope scaling the writer does not encode, is refused
naming the reason (`gguf_refusal`, seqtune.models.gguf_facts), by preflight before training and again here.

`check_gguf` is the post-flight proof for a written file: read back with gguf.GGUFReader, every tensor equals
merged/'s after the same transform (exactly for f16/bf16 after the dtype conversion, within Q8_0's per-block step),
the eos/eot ids are the trained terminators and the chat template is the trained one; and what llama.cpp's loader
checks holds (`loader_problems`: required keys, one token per embedding row, every tensor's shape against the
header). The vocabulary is padded to the embedding rows with `[PADn]` tokens, as convert_hf_to_gguf.py does.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seqtune.config.errors import ConfigError, SeqtuneError
from seqtune.export.artifacts import GGUF_DIR, ArtifactProof, check_readable, load_artifact
from seqtune.files import atomic_directory, atomic_output, follow_umask, storage_error
from seqtune.models.gguf_facts import QUANTIZED_SOURCE, WRITTEN_TYPES, gguf_refusal, rope_parameters, rope_type
from seqtune.models.registry import gguf_row
from seqtune.models.spec import GgufRow


def _row(model_type: str) -> GgufRow:
    row = gguf_row(model_type)
    assert row is not None, f"gguf_refusal checked model_type {model_type!r} first"
    return row


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute: HF's rotary halves -> llama.cpp's interleaved pairs."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _source_tensors(directory: Path, only: str | None = None) -> Iterator[tuple[str, np.ndarray]]:
    from safetensors import safe_open

    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # safe_open has no iteration
                if only is None or name == only:
                    yield name, f.get_tensor(name).float().numpy()


def _read_tensor(directory: Path, wanted: str) -> np.ndarray | None:
    return next((data for name, data in _source_tensors(directory, only=wanted)), None)


def expert_count(config: dict) -> int | None:
    """A mixture of experts' expert count, under either name transformers' configs use (None: no experts)."""
    return config.get("num_experts") or config.get("num_local_experts")


def _expert_tensor(name: str, arch: GgufRow) -> tuple[str, int, str] | None:
    """<layer>.experts.<e>.<projection>.weight -> (<layer>.experts, e, projection) for the row's projections."""
    match = re.fullmatch(r"(.+\.experts)\.(\d+)\.(\w+)\.weight", name)
    if match is None or match.group(3) not in arch.expert_projections:
        return None
    return match.group(1), int(match.group(2)), match.group(3)


def _stack_experts(
    tensors: Iterator[tuple[str, np.ndarray]], config: dict, arch: GgufRow
) -> Iterator[tuple[str, np.ndarray]]:
    """Each expert's projection on file stacked into one [n_expert, out, in] tensor per layer and projection,
    named <layer>.experts.<projection>.weight (convert_hf_to_gguf.py's merged experts, which gguf's TensorNameMap
    maps to blk.N.ffn_*_exps); GGUF stores it as {in, out, n_expert}, the shape llama.cpp's loader creates. A
    stack is written as soon as its last expert is read (safetensors lists a layer's experts together), so at most
    a few layers' experts are held at once."""
    n_experts = expert_count(config) or 0
    pending: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for name, data in tensors:
        expert = _expert_tensor(name, arch) if arch.expert_projections else None
        if expert is None:
            yield name, data
            continue
        prefix, index, projection = expert
        stack = pending.setdefault((prefix, projection), {})
        stack[index] = data
        if len(stack) == n_experts:
            del pending[(prefix, projection)]
            if sorted(stack) != list(range(n_experts)):
                raise SeqtuneError(f"seqtune bug: {prefix}.*.{projection} has experts {sorted(stack)}")
            yield f"{prefix}.{projection}.weight", np.stack([stack[e] for e in range(n_experts)])
    if pending:
        (prefix, projection), stack = next(iter(pending.items()))
        raise SeqtuneError(
            f"{prefix}.*.{projection}.weight: {len(stack)} experts on file, config.json says {n_experts}"
        )


def gguf_tensors(directory: Path, config: dict, arch: GgufRow) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) of every tensor llama.cpp reads, transformed as convert_hf_to_gguf.py does."""
    import gguf

    n_layers = config["num_hidden_layers"]
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.name), n_layers)
    n_head, n_kv = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    for name, data in _stack_experts(_source_tensors(directory), config, arch):
        # A head equal to the embedding is the tied one llama.cpp reuses; a head trained apart is written.
        embedding = _read_tensor(directory, "model.embed_tokens.weight") if name == "lm_head.weight" else None
        if embedding is not None and np.array_equal(data, embedding):
            continue
        if arch.permute_qk and name.endswith("self_attn.q_proj.weight"):
            data = _permute(data, n_head)
        elif arch.permute_qk and name.endswith("self_attn.k_proj.weight"):
            data = _permute(data, n_kv)
        if arch.norm_shift and name.endswith("norm.weight"):
            data = data + arch.norm_shift
        mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise SeqtuneError(f"seqtune bug: {directory}/{name} has no GGUF name for architecture {arch.name}")
        yield mapped, data
    if rope_type(config) == "llama3":
        yield "rope_freqs.weight", _llama3_rope_factors(config)


def _llama3_rope_factors(config: dict) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: Llama 3.1's per-frequency rope factors."""
    scaling = rope_parameters(config)
    base = scaling.get("rope_theta", config.get("rope_theta", 10000.0))
    dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    factor, low, high = (
        scaling.get("factor", 8.0),
        scaling.get("low_freq_factor", 1.0),
        scaling.get("high_freq_factor", 4.0),
    )
    old = scaling.get("original_max_position_embeddings", 8192)
    factors = []
    for freq in 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)):
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def _storage_type(gguf_type: str, data: np.ndarray) -> Any:
    """llama.cpp's rule: 1-D tensors (norms, rope factors) stay F32; Q8_0 needs rows in blocks of 32."""
    import gguf

    types = {
        "f16": gguf.GGMLQuantizationType.F16,
        "bf16": gguf.GGMLQuantizationType.BF16,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
    }
    if data.ndim < 2:
        return gguf.GGMLQuantizationType.F32
    if gguf_type == "q8_0" and data.shape[-1] % 32:
        return gguf.GGMLQuantizationType.F16
    return types[gguf_type]


# --- tokenizer ------------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class GgufVocab:
    model: str  # gpt2 (byte-level BPE) | llama (SentencePiece as BPE with byte fallback)
    pre: str
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    merges: list[str] = field(default_factory=list)
    add_space_prefix: bool = False  # SentencePiece: a "▁" before the text (Llama 2, Mistral; not Gemma 3)


def _pre_tokenizer(tokenizer_json: dict) -> str:
    """llama.cpp's pre-tokenizer name, from the split regex (llama.cpp identifies it by a hash of test encodings)."""
    text = json.dumps(tokenizer_json.get("pre_tokenizer"))
    if r"\\p{N}{1,3}" in text:
        return "llama-bpe"
    if r"\\p{N}|" in text or r"\\p{N}" in text and "qwen" in text.lower():
        return "qwen2"
    if '"ByteLevel"' in text and '"use_regex": true' in text and '"Split"' not in text:
        # GPT-2's own split (a ByteLevel pre-tokenizer with its regex: digits keep their leading space, " 3" is one
        # piece); llama.cpp's "default" splits digits apart, so the bundled TinyLlama tokenizer read other ids.
        return "gpt-2"
    return "default"


def _prepends_space(tokenizer_json: dict) -> bool:
    """The tokenizer puts SentencePiece's "▁" before a text (a Prepend normalizer, or a Metaspace pre-tokenizer
    that prepends): llama.cpp's add_space_prefix."""
    parts = [tokenizer_json.get("normalizer"), tokenizer_json.get("pre_tokenizer")]
    found = []
    while parts:
        part = parts.pop()
        if isinstance(part, dict):
            parts += part.get("normalizers", []) + part.get("pretokenizers", [])
            found.append(part)
    return any(
        (p.get("type") == "Prepend" and p.get("prepend") == "\u2581")
        or (
            p.get("type") == "Metaspace"
            and p.get("prepend_scheme", "always") != "never"
            and p.get("add_prefix_space", True)
        )
        for p in found
    )


# What convert_hf_to_gguf.py writes for an embedding row no token has: llama.cpp reads one token per row.
PAD_SCORE = -1000.0


def gguf_vocab(tokenizer: Any, tokenizer_json: dict, rows: int) -> GgufVocab:
    """The tokenizer as GGUF's token list, token types (CONTROL for special tokens, USER_DEFINED for other added
    ones, BYTE for <0xNN>), and merges (byte-level BPE) or scores (SentencePiece: higher for lower ids, the
    SentencePiece order). One token per embedding row (`rows`), as llama.cpp's loader requires: rows no token has
    (Qwen's 151,936 for 151,669 tokens, a resize to a multiple) are `[PADn]` tokens of type UNUSED, as
    convert_hf_to_gguf.py pads them."""
    import gguf

    model = tokenizer_json["model"]
    byte_fallback = model.get("type") == "BPE" and model.get("byte_fallback", False)
    if len(tokenizer) > rows:
        raise SeqtuneError(
            f"seqtune bug: the tokenizer has {len(tokenizer)} tokens for {rows} embedding rows (preflight's vocab "
            "check refuses this before training)"
        )
    size = rows
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    added = set(tokenizer.added_tokens_decoder)
    tokens, types = [], []
    for i in range(size):
        text = by_id.get(i, f"[PAD{i}]")
        tokens.append(text)
        if i not in by_id:
            types.append(gguf.TokenType.UNUSED)
        elif i in special:
            types.append(gguf.TokenType.CONTROL)
        elif i in added:
            types.append(gguf.TokenType.USER_DEFINED)
        elif byte_fallback and re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", text):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    if byte_fallback:
        return GgufVocab(
            model="llama",
            pre="default",
            tokens=tokens,
            types=[int(t) for t in types],
            scores=[_spm_score(i, t) for i, t in enumerate(types)],
            add_space_prefix=_prepends_space(tokenizer_json),
        )
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return GgufVocab(
        model="gpt2", pre=_pre_tokenizer(tokenizer_json), tokens=tokens, types=[int(t) for t in types], merges=merges
    )


def _spm_score(token_id: int, token_type: int) -> float:
    import gguf

    if token_type == gguf.TokenType.UNUSED:
        return PAD_SCORE
    return -float(token_id) if token_type == gguf.TokenType.NORMAL else 0.0


# --- writing --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class GgufIds:
    """What the file's tokenizer metadata says: bos, eos (the tokenizer's), eot (another trained terminator)."""

    bos: int | None
    eos: int
    eot: int | None
    pad: int | None


def terminator_ids(stop_eos: tuple[int, ...]) -> tuple[int, int | None]:
    """eos = the tokenizer's (first), eot = the first other trained terminator (GGUF holds one of each)."""
    return stop_eos[0], (stop_eos[1] if len(stop_eos) > 1 else None)


def write_gguf(
    source: Path,
    target: Path,
    gguf_type: str,
    *,
    ids: GgufIds,
    add_bos: bool,
    key: str,
    tokenizer_dir: Path | None = None,
) -> Path:
    """source: a transformers directory (merged/ or model/) with its tokenizer (or the one in `tokenizer_dir`: the
    trained tokenizer for an adapter's base); target: the .gguf file, written under a temporary name and renamed
    only when complete (a full disk, an error or a signal leaves no file under `target`'s name); `key`: what a disk
    error names as where the file goes."""
    import gguf
    from transformers import AutoTokenizer

    check_readable(sorted(source.glob("*.safetensors")))
    config = json.loads((source / "config.json").read_text())
    refusal = gguf_refusal(config.get("model_type", "?"), rope_type(config), config)
    if refusal:
        raise ConfigError(
            f"train.export_gguf: {refusal}.",
            key="train.export_gguf",
            fix="train.export_gguf=null (merged/ loads with transformers; convert it elsewhere).",
        )
    arch = _row(config["model_type"])
    logging.getLogger("gguf").setLevel(logging.WARNING)  # its "Little Endian only" notice says nothing to act on
    tokenizer_dir = tokenizer_dir or source
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab = gguf_vocab(tokenizer, json.loads((tokenizer_dir / "tokenizer.json").read_text()), rows=config["vocab_size"])
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise storage_error(exc, target.parent, key=key) from None
    with atomic_output(target, key=key) as partial:
        # use_temp_file: converted tensors spool to disk until written, not the whole model in memory.
        writer = gguf.GGUFWriter(
            str(partial), gguf.MODEL_ARCH_NAMES[getattr(gguf.MODEL_ARCH, arch.name)], use_temp_file=True
        )
        try:
            _write_metadata(writer, config, arch, gguf_type, source)
            _write_tokenizer(writer, vocab, ids, add_bos=add_bos, template=tokenizer.chat_template)
            for name, data in gguf_tensors(source, config, arch):
                qtype = _storage_type(gguf_type, data)
                writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.fout[0].flush()  # type: ignore[index]  # opened by write_header_to_file: one file, no shards
            os.fsync(writer.fout[0].fileno())  # type: ignore[index]  # a full disk is found here, not at close
        finally:
            _close(writer)
        follow_umask(partial)
    return target


def _close(writer: Any) -> None:
    """Close the writer's file; after a failed write (a full disk) its last flush may fail again, and the partial
    file is removed regardless."""
    try:
        writer.close()
    except OSError:
        pass


def _write_metadata(writer: Any, config: dict, arch: GgufRow, gguf_type: str, source: Path) -> None:
    import gguf

    n_head = config["num_attention_heads"]
    writer.add_name(source.parent.name)
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(config.get("num_key_value_heads") or n_head)
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
    rope = rope_parameters(config)
    # Gemma 3 on transformers 5 states its theta per layer type only: the global layers' (1e6) was lost to the
    # 10000 default, and llama.cpp's global layers rotated at the sliding layers' frequencies (bench/README.md 11).
    writer.add_rope_freq_base(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)
    if sliding := rope_parameters(config, "sliding_attention").get("rope_theta"):
        writer.add_rope_freq_base_swa(sliding)
    writer.add_rope_dimension_count(config.get("head_dim") or config["hidden_size"] // n_head)
    writer.add_vocab_size(config["vocab_size"])
    if config.get("head_dim"):  # as convert_hf_to_gguf.py writes it: llama.cpp otherwise takes n_embd / n_head
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if rope_type(config) == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    file_types = {
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "bf16": gguf.LlamaFileType.MOSTLY_BF16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }
    writer.add_file_type(file_types[gguf_type])
    if arch.expert_projections:  # convert_hf_to_gguf.py TextModel / Qwen2MoeModel.set_gguf_parameters
        writer.add_expert_count(expert_count(config))
        writer.add_expert_used_count(config["num_experts_per_tok"])
        if config.get("moe_intermediate_size"):
            writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if arch.extra is not None:
        arch.extra(writer, config)


def _write_tokenizer(writer: Any, vocab: GgufVocab, ids: GgufIds, *, add_bos: bool, template: str | None) -> None:
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
        writer.add_add_space_prefix(vocab.add_space_prefix)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    if ids.bos is not None:
        writer.add_bos_token_id(ids.bos)
    writer.add_eos_token_id(ids.eos)
    if ids.eot is not None:
        writer.add_eot_token_id(ids.eot)
    if ids.pad is not None:
        writer.add_pad_token_id(ids.pad)
    writer.add_add_bos_token(add_bos)
    writer.add_add_eos_token(False)
    if template:
        writer.add_chat_template(template)


def gguf_path(run_dir: Path, gguf_type: str) -> Path:
    return run_dir / GGUF_DIR / f"{run_dir.name}-{gguf_type}.gguf"


def gguf_type(path: Path) -> str:
    """A file's type from its name (<run>-<type>.gguf, as gguf_path names it)."""
    return path.stem.rsplit("-", 1)[-1]


def export_run_gguf(run_dir: Path, gguf_types: tuple[str, ...], *, key: str) -> list[Path]:
    """RUN_DIR/gguf/<run>-<type>.gguf for each type, with its Ollama Modelfile. The f16 file is written first for a
    k-quant (llama.cpp quantizes it) and kept: it is what the k-quant's proof compares with."""
    run_dir = Path(run_dir)
    written = [
        t for t in WRITTEN_TYPES if t in gguf_types or (t == QUANTIZED_SOURCE and set(gguf_types) - {*WRITTEN_TYPES})
    ]
    paths = [_export_written(run_dir, gguf_type, key=key) for gguf_type in written]
    for gguf_type in (t for t in gguf_types if t not in WRITTEN_TYPES):
        paths.append(_export_quantized(run_dir, gguf_type, key=key))
    return paths


def _export_quantized(run_dir: Path, gguf_type: str, *, key: str) -> Path:
    """llama.cpp's own quantization of the f16 file into `gguf_type`, written atomically, with its Modelfile."""
    from seqtune.export.modelfile import write_modelfile
    from seqtune.llama_cpp import quantize

    target = gguf_path(run_dir, gguf_type)
    with atomic_output(target, key=key) as partial:
        quantize(gguf_path(run_dir, QUANTIZED_SOURCE), partial, gguf_type)
        follow_umask(partial)
    write_modelfile(target, key=key)
    print(f"saved GGUF ({gguf_type}, llama.cpp's quantizer): {target}", flush=True)
    return target


def _export_written(run_dir: Path, gguf_type: str, *, key: str) -> Path:
    """RUN_DIR/gguf/<run>-<type>.gguf from merged/ (LoRA; written first from adapter/ on its base when missing) or
    model/ (a full fine-tune). Both written atomically; `key` names where they go in a disk error (hydra.run.dir
    at the end of training, RUN_DIR for `python -m seqtune.export`)."""
    from transformers import AutoTokenizer

    from seqtune.export.facts import ship_facts
    from seqtune.export.modelfile import write_modelfile

    run_dir = Path(run_dir)
    source = (
        run_dir / "merged" if (run_dir / "merged").is_dir() or (run_dir / "adapter").is_dir() else run_dir / "model"
    )
    if source.name == "merged" and not source.is_dir():
        _merge_adapter(run_dir, source, key=key)
    if not (source / "config.json").is_file():
        raise ConfigError(
            f"{run_dir} has no merged/, adapter/ or model/ to export.",
            key="RUN_DIR",
            fix="name the run directory of a finished training run.",
        )
    tokenizer = AutoTokenizer.from_pretrained(source)
    facts = ship_facts(tokenizer, run_dir)
    eos, eot = terminator_ids(facts.stop.eos)
    ids = GgufIds(bos=facts.stop.bos, eos=eos, eot=eot, pad=facts.stop.pad)
    add_bos = tokenizer.bos_token_id is not None and tokenizer("a")["input_ids"][:1] == [tokenizer.bos_token_id]
    target = write_gguf(source, gguf_path(run_dir, gguf_type), gguf_type, ids=ids, add_bos=add_bos, key=key)
    write_modelfile(target, key=key)
    print(f"saved GGUF ({gguf_type}): {target}; its chat template: {facts.template_note}", flush=True)
    return target


def _merge_adapter(run_dir: Path, target: Path, *, key: str) -> None:
    """merged/ from adapter/ on the base its adapter_config.json names (an on-demand export of a LoRA run)."""
    import torch
    from transformers import AutoTokenizer

    from seqtune.export.facts import ship_facts, shipped_config

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "adapter")
    model: Any = load_artifact(ship_facts(tokenizer, run_dir), "adapter", device=torch.device("cpu"))
    merged = model.merge_and_unload()
    with atomic_directory(target, key=key) as staging, shipped_config(merged):
        merged.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)


# --- the proof ------------------------------------------------------------------------------------------------------


def _field(reader: Any, key: str) -> Any:
    found = reader.get_field(key)
    return None if found is None else found.contents()


def check_gguf(path: Path, facts: Any) -> Any:
    """Read `path` back: tensors against merged/ (or model/), ids against the trained terminators, the template
    against the trained one. An ArtifactProof named gguf/<file>."""
    import gguf
    from transformers import AutoTokenizer

    run_dir = facts.run_dir
    source = run_dir / "merged" if (run_dir / "merged").is_dir() else run_dir / "model"
    config = json.loads((source / "config.json").read_text())
    arch = _row(config["model_type"])
    reader = gguf.GGUFReader(str(path))
    stored = {t.name: t for t in reader.tensors}
    failures: list[str] = []
    worst, exact = 0.0, True
    expected_names = set()
    for name, expected in gguf_tensors(source, config, arch):
        expected_names.add(name)
        tensor = stored.get(name)
        if tensor is None:
            failures.append(f"tensor {name} is missing")
            continue
        got = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(expected.shape).astype(np.float32)
        reference = _as_stored(expected, tensor.tensor_type)
        if tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0:
            exact = False
            bound = _q8_bound(expected)
            excess = float(np.max(np.abs(got - expected).reshape(-1, 32) - bound[:, None])) if expected.size else 0.0
            worst = max(worst, float(np.max(np.abs(got - expected))) if expected.size else 0.0)
            if excess > 0:
                failures.append(f"tensor {name} differs from {source.name}/ by more than Q8_0's step")
        elif not np.array_equal(got, reference):
            failures.append(f"tensor {name} differs from {source.name}/ ({tensor.tensor_type.name})")
    if extra := set(stored) - expected_names:
        failures.append(f"tensors not in {source.name}/: {sorted(extra)[:3]}")
    failures += loader_problems(reader, arch)
    failures += _expert_problems(reader, stored, source, config, arch)
    eos, eot = terminator_ids(facts.stop.eos)
    found_ids = {
        "eos": _field(reader, gguf.Keys.Tokenizer.EOS_ID),
        "eot": _field(reader, gguf.Keys.Tokenizer.EOT_ID),
        "bos": _field(reader, gguf.Keys.Tokenizer.BOS_ID),
    }
    wanted = {"eos": eos, "eot": eot, "bos": facts.stop.bos}
    for key, value in wanted.items():
        if found_ids[key] != value:
            failures.append(f"tokenizer.ggml.{key}_token_id is {found_ids[key]}, the trained one is {value}")
    trained_template = AutoTokenizer.from_pretrained(source).chat_template
    template = _field(reader, gguf.Keys.Tokenizer.CHAT_TEMPLATE)
    if (template or None) != (trained_template or None):
        failures.append("tokenizer.chat_template is not the template trained with")
    stacks = sum(name.endswith("_exps.weight") for name in expected_names)
    experts = f" ({stacks} expert stacks, {expert_count(config)} experts each, read back per expert)" if stacks else ""
    summary = (
        f"{len(expected_names)} tensors {'equal to' if exact else 'within Q8_0 step of'} {source.name}/{experts}"
        f"{'' if exact else f' (max |difference| {worst:.2g})'}; eos {eos}"
        f"{f', eot {eot}' if eot is not None else ''}; chat template {'set' if template else 'none'}"
    )
    return ArtifactProof(
        artifact=f"{GGUF_DIR}/{path.name}",
        ok=not failures,
        checks={
            "summary": summary,
            "tensors": len(expected_names),
            "ids": found_ids,
            "max_difference": worst,
            "chat_template": bool(template),
        },
        failures=failures,
    )


def _expert_problems(reader: Any, stored: dict[str, Any], source: Path, config: dict, arch: GgufRow) -> list[str]:
    """A mixture of experts, proven apart from the stacking that wrote it: the header's expert counts are
    config.json's, and slice e of every blk.N.ffn_*_exps tensor equals expert e's projection on file, read by its
    own name (model.layers.N.<...>.experts.<e>.<projection>.weight)."""
    import gguf

    if not arch.expert_projections:
        return []
    name = _field(reader, "general.architecture")
    wanted = {
        "expert_count": expert_count(config),
        "expert_used_count": config["num_experts_per_tok"],
        "expert_feed_forward_length": config.get("moe_intermediate_size"),
    }
    failures = [
        f"{name}.{key} is {_field(reader, f'{name}.{key}')}, config.json says {value}"
        for key, value in wanted.items()
        if _field(reader, f"{name}.{key}") != value
    ]
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.name), config["num_hidden_layers"])
    checked = 0
    for file_name, data in _source_tensors(source):
        expert = _expert_tensor(file_name, arch)
        if expert is None:
            continue
        prefix, index, projection = expert
        target = names.get_name(f"{prefix}.{projection}.weight", try_suffixes=(".weight",))
        tensor = stored.get(target or "")
        if tensor is None:
            failures.append(f"{file_name} has no stacked tensor ({target}) in the file")
            continue
        got = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        got = got.reshape(int(tensor.shape[-1]), *data.shape)[index]
        if tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0:
            if np.any(np.abs(got - data).reshape(-1, 32) > _q8_bound(data)[:, None]):
                failures.append(f"{target}[{index}] differs from {source.name}/{file_name} by more than Q8_0's step")
        elif not np.array_equal(got, _as_stored(data, tensor.tensor_type)):
            failures.append(f"{target}[{index}] differs from {source.name}/{file_name}")
        checked += 1
    if checked == 0:
        failures.append(f"{source.name}/ holds no per-expert tensors ({', '.join(arch.expert_projections)})")
    return failures


# Keys llama.cpp's loader requires of the Llama-layout architectures ({arch} replaced), beyond the tokenizer's.
REQUIRED_KEYS = (
    "general.architecture",
    "{arch}.context_length",
    "{arch}.embedding_length",
    "{arch}.block_count",
    "{arch}.feed_forward_length",
    "{arch}.attention.head_count",
    "{arch}.attention.layer_norm_rms_epsilon",
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
)


# What llama.cpp's loader requires of a mixture of experts (n_expert, n_expert_used > 0: it throws otherwise).
REQUIRED_EXPERT_KEYS = ("{arch}.expert_count", "{arch}.expert_used_count")


def loader_problems(reader: Any, row: GgufRow | None = None) -> list[str]:
    """What llama.cpp's loader checks before it runs a file (llama-model.cpp, llama-vocab.cpp): the required keys,
    one token per embedding row (token types and scores alike), and every tensor's shape against the sizes the
    header states; a tensor it does not read fails its tensor count. Our own reader does not check any of these.
    `row`: the architecture's GgufRow where known (the width of its q/k norms)."""
    arch = _field(reader, "general.architecture")
    moe = any(t.name.endswith("ffn_gate_inp.weight") for t in reader.tensors)
    required = REQUIRED_KEYS + (REQUIRED_EXPERT_KEYS if moe else ())
    missing = [key.format(arch=arch) for key in required if reader.get_field(key.format(arch=arch)) is None]
    if missing:
        return [f"llama.cpp requires {', '.join(missing)}, missing from the header"]
    tokens = len(_field(reader, "tokenizer.ggml.tokens"))
    problems = [
        f"{key} has {n} entries for {tokens} tokens"
        for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores")
        if reader.get_field(key) is not None and (n := len(_field(reader, key))) != tokens
    ]
    expected = _expected_shapes(reader, arch, tokens, qk_norm_width=row.qk_norm_width if row else "head")
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in tensor.shape)
        want = _shape_for(tensor.name, expected)
        if want is None:
            problems.append(f"tensor {tensor.name} is not one llama.cpp's {arch} loader reads")
        elif shape != want:
            problems.append(
                f"tensor {tensor.name} has shape {list(shape)}, llama.cpp expects {list(want)} from the header"
                + (f" ({tokens} tokens)" if tensor.name in ("token_embd.weight", "output.weight") else "")
            )
    return problems


def _expected_shapes(reader: Any, arch: str, tokens: int, *, qk_norm_width: str) -> dict[str, tuple[int, ...]]:
    """GGML order (the row length first), as llama.cpp's create_tensor calls state them."""
    n_embd = int(_field(reader, f"{arch}.embedding_length"))
    n_head = int(_field(reader, f"{arch}.attention.head_count"))
    n_kv = int(_field(reader, f"{arch}.attention.head_count_kv") or n_head)
    n_ff = int(_field(reader, f"{arch}.feed_forward_length"))
    head_k = int(_field(reader, f"{arch}.attention.key_length") or n_embd // n_head)
    head_v = int(_field(reader, f"{arch}.attention.value_length") or n_embd // n_head)
    rope_dim = int(_field(reader, f"{arch}.rope.dimension_count") or head_k)
    # A mixture of experts: n_ff_exp is expert_feed_forward_length where stated (qwen3moe), else n_ff (llama, olmoe).
    n_expert = int(_field(reader, f"{arch}.expert_count") or 0)
    n_ff_exp = int(_field(reader, f"{arch}.expert_feed_forward_length") or n_ff)
    q_norm, k_norm = (head_k, head_k) if qk_norm_width == "head" else (n_head * head_k, n_kv * head_k)
    return {
        "token_embd.weight": (n_embd, tokens),
        "output.weight": (n_embd, tokens),
        "output_norm.weight": (n_embd,),
        "rope_freqs.weight": (rope_dim // 2,),
        "attn_norm.weight": (n_embd,),
        "ffn_norm.weight": (n_embd,),
        "post_attention_norm.weight": (n_embd,),
        "post_ffw_norm.weight": (n_embd,),
        "attn_q.weight": (n_embd, n_head * head_k),
        "attn_k.weight": (n_embd, n_kv * head_k),
        "attn_v.weight": (n_embd, n_kv * head_v),
        "attn_output.weight": (n_head * head_v, n_embd),
        "attn_q.bias": (n_head * head_k,),
        "attn_k.bias": (n_kv * head_k,),
        "attn_v.bias": (n_kv * head_v,),
        "attn_q_norm.weight": (q_norm,),
        "attn_k_norm.weight": (k_norm,),
        "ffn_gate.weight": (n_embd, n_ff),
        "ffn_up.weight": (n_embd, n_ff),
        "ffn_down.weight": (n_ff, n_embd),
        "ffn_gate_inp.weight": (n_embd, n_expert),
        "ffn_gate_exps.weight": (n_embd, n_ff_exp, n_expert),
        "ffn_up_exps.weight": (n_embd, n_ff_exp, n_expert),
        "ffn_down_exps.weight": (n_ff_exp, n_embd, n_expert),
        "blocks": (int(_field(reader, f"{arch}.block_count")),),
    }


def _shape_for(name: str, expected: dict[str, tuple[int, ...]]) -> tuple[int, ...] | None:
    match = re.fullmatch(r"blk\.(\d+)\.(.+)", name)
    if match is None:
        return (
            expected.get(name)
            if name in ("token_embd.weight", "output.weight", "output_norm.weight", "rope_freqs.weight")
            else None
        )
    block, rest = int(match.group(1)), match.group(2)
    if block >= expected["blocks"][0] or rest in ("token_embd.weight", "output.weight", "output_norm.weight"):
        return None
    return expected.get(rest)


def _as_stored(expected: np.ndarray, qtype: Any) -> np.ndarray:
    """What an exact F32/F16/BF16 store of `expected` reads back as."""
    import gguf

    return (
        gguf.quants.dequantize(gguf.quants.quantize(expected, qtype), qtype).reshape(expected.shape).astype(np.float32)
    )


def _q8_bound(data: np.ndarray) -> np.ndarray:
    """Per block of 32: Q8_0's error bound: half its step d = max |x| / 127, plus 127 times the fp16 rounding of d
    (relative 2^-11, or 2^-25 absolute where d is subnormal in fp16); here a full step plus 127 * 2^-24."""
    step = np.abs(data.reshape(-1, 32)).max(axis=1) / 127.0
    return step * (1.0 + 127 * 2.0**-11) + 127 * 2.0**-24
