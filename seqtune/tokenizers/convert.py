"""Convert tiktoken, sentencepiece and GGUF vocab files into Hugging Face fast-tokenizer directories, and check them.

Built directly with the `tokenizers` library instead of going through transformers' slow tokenizers, because two
shortcuts fail silently: `LlamaTokenizer(vocab_file=...)` can yield an empty 3-token tokenizer, and AutoTokenizer
on a folder holding only `tokenizer.model` drops the "▁" before the first word. `check_hf_dir` compares every
converted tokenizer with the original library (or llama.cpp's reference encodings) so such a bug cannot pass.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

if TYPE_CHECKING:
    from seqtune.tokenizers.pypi import PypiTokenizer

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
]
# Qwen (1 to 3): the pre-tokenizer splits digits one by one (Llama 3 groups up to three).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
# Qwen3's added tokens after the 151,643 byte-level ranks, in id order (151643...), and whether each is special
# (skipped by decode(skip_special_tokens=True)) as Qwen3's tokenizer.json marks it.
QWEN3_ADDED = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
# GGUF / sentencepiece piece types.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# Texts every converted tokenizer must encode exactly as the original library does.
REFERENCE_TEXTS = [
    "Hello world",
    " Hello world",
    "Hello, world! How are you?",
    "  two leading spaces",
    "tabs\tand\nnewlines\n\n",
    "numbers 1234567 and 3.14159",
    "Ünïcödé façade naïve café",
    "日本語のテキスト",
    "emoji 🦙🚀 end",
    "def f(x):\n    return x ** 2  # square",
    "<b>not a tag</b> <p>",
    "a" * 40,
    "runs:    four spaces,\t\ttwo tabs,\n\n\nthree newlines",
]


@dataclass(kw_only=True)
class Converted:
    tokenizer: Tokenizer
    # The chat template embedded in the source file, if any (GGUF files carry one).
    chat_template: str | None = None


def convert(kind: str, raw: Path) -> Converted:
    if kind == "tiktoken":
        return Converted(tokenizer=from_tiktoken(raw))
    if kind == "qwen_tiktoken":
        return Converted(tokenizer=from_qwen_tiktoken(raw))
    if kind == "sentencepiece":
        return Converted(tokenizer=from_sentencepiece(raw))
    if kind == "gguf":
        return from_gguf(raw)
    raise ValueError(f"unknown tokenizer kind {kind!r}")


# ---------------------------------------------------------------------------------------------------------------
# tiktoken (Llama 3)
# ---------------------------------------------------------------------------------------------------------------


def llama3_special_tokens(num_reserved: int = 256) -> list[str]:
    reserved = [f"<|reserved_special_token_{2 + i}|>" for i in range(num_reserved - len(LLAMA3_SPECIALS))]
    return LLAMA3_SPECIALS + reserved


def from_tiktoken(raw: Path) -> Tokenizer:
    from transformers.convert_slow_tokenizer import TikTokenConverter

    # The converter recovers the byte-level merges from the ranks; specials follow the 128,000 ranks in order.
    converter = TikTokenConverter(
        vocab_file=str(raw), pattern=LLAMA3_PATTERN, extra_special_tokens=llama3_special_tokens()
    )
    return converter.converted()


def from_qwen_tiktoken(raw: Path) -> Tokenizer:
    """Qwen's byte-level BPE from its tiktoken ranks (151,643), NFC-normalized as Qwen's tokenizer.json is, with
    Qwen3's 26 added tokens at their ids."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    specials = [text for text, special in QWEN3_ADDED if special]
    tokenizer = TikTokenConverter(vocab_file=str(raw), pattern=QWEN_PATTERN, extra_special_tokens=specials).converted()
    tokenizer.normalizer = normalizers.NFC()
    # Added but not special (Qwen marks them so): tool-call, fill-in-the-middle and thinking markers.
    tokenizer.add_tokens(
        [AddedToken(text, special=False, normalized=False) for text, special in QWEN3_ADDED if not special]
    )
    return tokenizer


# ---------------------------------------------------------------------------------------------------------------
# sentencepiece BPE (Mistral, Llama 2) and GGUF vocab files
# ---------------------------------------------------------------------------------------------------------------


def from_sentencepiece(raw: Path) -> Tokenizer:
    # Read the model proto itself: the processor API cannot tell user-defined pieces (Gemma's <start_of_turn>,
    # whitespace runs; Mistral v3's [REFERENCE_DOC_n]) from normal ones, nor say whether a dummy "▁" is prepended.
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # protobuf builds the class at import
    model.ParseFromString(raw.read_bytes())
    if model.trainer_spec.model_type != model.trainer_spec.BPE:
        raise ValueError(
            f"{raw} is a sentencepiece {model.trainer_spec.ModelType.Name(model.trainer_spec.model_type)}"
            " model; only BPE models convert"
        )
    pieces = [piece.piece for piece in model.pieces]
    scores = [piece.score for piece in model.pieces]
    types = [int(piece.type) for piece in model.pieces]
    return spm_bpe(pieces, scores, types, add_prefix_space=model.normalizer_spec.add_dummy_prefix)


def spm_bpe(
    pieces: list[str],
    scores: list[float],
    types: list[int],
    merges: list[tuple[str, str]] | None = None,
    *,
    add_prefix_space: bool = True,
) -> Tokenizer:
    """A sentencepiece-style BPE: '▁' for spaces, byte fallback, merges ranked by the merged piece's score."""
    vocab = {piece: i for i, piece in enumerate(pieces)}
    if merges is None:
        merges = merges_from_scores(pieces, scores, types, vocab)
    unk = pieces[types.index(UNKNOWN)] if UNKNOWN in types else None
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    # Legacy Llama behaviour (what the official tokenizer.json files do): a dummy "▁" before the text.
    steps = [normalizers.Prepend("▁")] if add_prefix_space else []
    tokenizer.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    decode_steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix_space:
        decode_steps.append(decoders.Strip(content=" ", left=1, right=0))
    tokenizer.decoder = decoders.Sequence(decode_steps)
    # sentencepiece matches user-defined pieces on the normalized text ("▁▁" is two spaces), so they are matched
    # after normalization here too; control pieces are never normalized (chat templates write them literally).
    tokenizer.add_tokens(
        [AddedToken(pieces[i], special=False, normalized=True) for i, t in enumerate(types) if t == USER_DEFINED]
    )
    tokenizer.add_special_tokens(
        [AddedToken(pieces[i], special=True, normalized=False) for i, t in enumerate(types) if t in (UNKNOWN, CONTROL)]
    )
    return tokenizer


def merges_from_scores(
    pieces: list[str], scores: list[float], types: list[int], vocab: dict[str, int]
) -> list[tuple[str, str]]:
    # sentencepiece BPE applies the merge whose result has the highest score first, so rank by that score.
    ranked = []
    for piece, score, kind in zip(pieces, scores, types, strict=True):
        if kind != NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def from_gguf(raw: Path) -> Converted:
    meta = read_gguf_metadata(raw)
    pieces = meta["tokenizer.ggml.tokens"]
    scores = [float(s) for s in meta["tokenizer.ggml.scores"]]
    types = [int(t) for t in meta["tokenizer.ggml.token_type"]]
    merges = None
    if "tokenizer.ggml.merges" in meta:
        vocab = {piece: i for i, piece in enumerate(pieces)}
        merges = [_split_merge(m, vocab) for m in meta["tokenizer.ggml.merges"]]
    add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tokenizer = spm_bpe(pieces, scores, types, merges, add_prefix_space=add_prefix)
    return Converted(tokenizer=tokenizer, chat_template=meta.get("tokenizer.chat_template"))


# GGUF value types -> struct format (8 = string, 9 = array).
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_gguf_metadata(path: Path) -> dict:
    """The key/value header of a GGUF file. gguf.GGUFReader takes ~60 s on Gemma's 800k strings; this takes ~1 s."""
    data = memoryview(path.read_bytes())
    if bytes(data[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    _, _, kv_count = struct.unpack_from("<IQQ", data, 4)
    offset, meta = 24, {}
    for _ in range(kv_count):
        key, offset = _gguf_string(data, offset)
        (vtype,), offset = struct.unpack_from("<I", data, offset), offset + 4
        meta[key], offset = _gguf_read(data, offset, vtype)
    return meta


def _gguf_string(data: memoryview, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", data, offset)
    start = offset + 8
    return str(data[start : start + length], "utf-8"), start + length


def _gguf_read(data: memoryview, offset: int, vtype: int):
    if vtype == 8:
        return _gguf_string(data, offset)
    if vtype in _GGUF_SCALARS:
        fmt = "<" + _GGUF_SCALARS[vtype]
        return struct.unpack_from(fmt, data, offset)[0], offset + struct.calcsize(fmt)
    if vtype != 9:
        raise ValueError(f"unknown GGUF value type {vtype}")
    elem_type, count = struct.unpack_from("<IQ", data, offset)
    offset += 12
    if elem_type in _GGUF_SCALARS:  # fixed-size elements: one unpack for the whole array
        fmt = f"<{count}{_GGUF_SCALARS[elem_type]}"
        return list(struct.unpack_from(fmt, data, offset)), offset + struct.calcsize(fmt)
    values = []
    for _ in range(count):
        value, offset = _gguf_read(data, offset, elem_type)
        values.append(value)
    return values, offset


def _split_merge(merge: str, vocab: dict[str, int]) -> tuple[str, str]:
    # GGUF stores a merge as "left right"; a piece can itself hold a space, so pick the cut whose halves exist.
    for cut in [i for i, ch in enumerate(merge) if ch == " "]:
        left, right = merge[:cut], merge[cut + 1 :]
        if left in vocab and right in vocab and left + right in vocab:
            return left, right
    raise ValueError(f"GGUF merge {merge!r} does not split into two vocabulary pieces")


# ---------------------------------------------------------------------------------------------------------------
# Saving as a Hugging Face directory
# ---------------------------------------------------------------------------------------------------------------


def save_hf_dir(
    converted: Converted,
    out: Path,
    *,
    bos: str | None,
    eos: str,
    pad: str | None,
    unk: str | None,
    chat_template: str | None,
) -> None:
    tokenizer = converted.tokenizer
    if bos is not None:  # Qwen has none: nothing is prepended
        bos_id = tokenizer.token_to_id(bos)
        # bos is prepended by the tokenizer (as the official files do); eos is the data pipeline's decision.
        prepend_bos = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
        if isinstance(tokenizer.post_processor, processors.ByteLevel):
            tokenizer.post_processor = processors.Sequence([tokenizer.post_processor, prepend_bos])
        else:
            tokenizer.post_processor = prepend_bos
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    special = {"bos_token": bos, "eos_token": eos, "unk_token": unk, "pad_token": pad}
    special = {k: v for k, v in special.items() if v is not None}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": bos is not None,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000,
        "chat_template": chat_template,
    }
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------------------


def read_vectors(inp: Path | None, out: Path | None) -> list[tuple[str, list[int]]]:
    """llama.cpp's reference encodings: texts separated by a marker line, one line of ids per text."""
    if inp is None or out is None:
        return []
    texts = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    # Read as llama.cpp's test-tokenizer-0 reads it (getline): a final newline ends the last line, it is not one
    # more line (Gemma 4's .out has one, Llama 2's has none). An empty line inside is a text that encodes to nothing.
    ids = out.read_text(encoding="utf-8").split("\n")
    if len(ids) == len(texts) + 1 and ids[-1] == "":
        ids.pop()
    if len(ids) != len(texts):
        raise ValueError(f"{out.name} has {len(ids)} lines of ids for the {len(texts)} texts of {inp.name}")
    return [(text, [int(i) for i in line.split()]) for text, line in zip(texts, ids, strict=True)]


def reference_encoder(kind: str, raw: Path):
    """The original library's encoder (text -> ids without specials), or None where only vectors exist."""
    if kind in ("tiktoken", "qwen_tiktoken"):
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        ranks = load_tiktoken_bpe(str(raw))
        added = llama3_special_tokens() if kind == "tiktoken" else [text for text, _ in QWEN3_ADDED]
        specials = {t: len(ranks) + i for i, t in enumerate(added)}
        pattern = LLAMA3_PATTERN if kind == "tiktoken" else QWEN_PATTERN
        enc = tiktoken.Encoding(name=kind, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
        return lambda text: enc.encode(text, disallowed_special=())
    if kind == "sentencepiece":
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=str(raw))
        return sp.encode
    return None


def check_hf_dir(
    directory: Path, *, source: PypiTokenizer, raw: Path, vectors: list[tuple[str, list[int]]]
) -> list[str]:
    """Every way the conversion could be wrong, as messages (empty = the tokenizer is the real one)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    problems = []
    if not tok.is_fast or len(tok) != source.vocab_size:
        problems.append(f"vocab size {len(tok)} (fast={tok.is_fast}), expected {source.vocab_size}")
    if tok.bos_token != source.bos or tok.eos_token != source.eos:
        problems.append(f"bos/eos {tok.bos_token}/{tok.eos_token}, expected {source.bos}/{source.eos}")
    cases = [(text, list(ids)) for text, ids in source.known] + vectors
    reference = reference_encoder(source.kind, raw)
    if reference is not None:
        cases += [(text, reference(text)) for text in REFERENCE_TEXTS]
    for text, expected in cases:
        got = tok.encode(text, add_special_tokens=False)
        if got != expected:
            problems.append(f"encode({text!r}) = {got[:16]}, the real tokenizer gives {expected[:16]}")
        elif tok.decode(got) != text and reference is not None:
            problems.append(f"decode(encode({text!r})) = {tok.decode(got)!r}")
    with_specials = tok("Hello world")["input_ids"]
    if source.bos is None and with_specials != tok.encode("Hello world", add_special_tokens=False):
        problems.append(
            f"'Hello world' with specials encodes to {with_specials}: this tokenizer has no bos, so "
            "nothing may be added"
        )
    elif source.bos is not None and (
        with_specials[:1] != [tok.bos_token_id] or with_specials.count(tok.bos_token_id) != 1
    ):
        problems.append(f"'Hello world' with specials encodes to {with_specials}: bos must be prepended exactly once")
    return problems
