"""The proof of a GGUF file llama.cpp quantized (q4_k_m, q5_k_m, q6_k): it is run IN llama.cpp, since its blocks
cannot be compared tensor by tensor with merged/ the way seqtune's own f16/bf16/q8_0 files are (check_gguf).

- llama.cpp loads it;
- llama.cpp's tokenizer reads each rendered validation prompt (the reference prompts' ids, decoded, where that
  round-trips) and two probe conversations rendered with the run's template to the ids transformers reads;
- its next-token distribution on the reference positions (each prompt's last token, then its first reference
  tokens) is within the type's bound of the f16 file's, run in llama.cpp too. The bounded metric is the largest
  |logit difference| relative to max(1, the largest |f16 logit|): unlike a KL divergence or a probability
  difference it does not shrink on a near-uniform distribution (an untrained tiny model's), so the bound means the
  same on a tiny model and a real one. KL(f16 || quantized) and top-1 agreement are recorded beside it;
- every trained terminator is an end-of-generation token for llama.cpp (its greedy generation stops there), and
  the greedy continuation of the first prompt is recorded, with the f16 file's.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from seqtune.export.artifacts import GGUF_DIR, POSITIONS, ArtifactProof

# Largest relative logit difference from the f16 file allowed per type. Measured on tiny random models whose rows
# fit the k-quant blocks (hidden 256): see docs/export.md for the values; the bounds leave about 3x headroom.
BOUNDS = {"q6_k": 0.04, "q5_k_m": 0.08, "q4_k_m": 0.12}
GREEDY_TOKENS = 16


def prove_quantized(path: Path, source: Path, facts: Any, tokenizer: Any, prompts: list[Any], gguf_type: str):
    """An ArtifactProof named gguf/<file> for `path`, quantized by llama.cpp from the f16 file `source`."""
    from seqtune.config.errors import SeqtuneError
    from seqtune.llama_cpp import LlamaModel, version

    artifact = f"{GGUF_DIR}/{path.name}"
    room = context_for(prompts)
    try:
        quantized, reference = LlamaModel(path, n_ctx=room), LlamaModel(source, n_ctx=room)
    except SeqtuneError as exc:
        return ArtifactProof(artifact=artifact, ok=False, failures=[str(exc)])
    with quantized, reference:
        checks: dict[str, Any] = {
            "engine": version(),
            "compared_with": f"{GGUF_DIR}/{source.name}",
            "bound": BOUNDS[gguf_type],
        }
        checks.update(_distribution(quantized, reference, prompts))
        checks["prompt_ids_equal"] = _same_ids(quantized, tokenizer, prompts)
        checks["stops"] = {str(t): quantized.is_end(t) for t in facts.stop.eos}
        first = prompts[0].prompt_ids
        checks["greedy_prompt"] = list(first)  # what seqtune.serve --gguf answers with these tokens
        checks["greedy"] = quantized.greedy(first, GREEDY_TOKENS, quantized.end_ids())
        checks["greedy_f16"] = reference.greedy(first, GREEDY_TOKENS, reference.end_ids())
    failures = []
    if checks["max_logit_difference_relative"] > checks["bound"]:
        failures.append(
            f"next-token logits {checks['max_logit_difference_relative']:.3g} (relative) from the f16 file's, "
            f"above {gguf_type}'s bound {checks['bound']}"
        )
    if not all(checks["prompt_ids_equal"]):
        failures.append("llama.cpp tokenizes a rendered validation prompt to other ids than transformers")
    failures += [
        f"llama.cpp does not end generation at trained terminator {t}" for t, ok in checks["stops"].items() if not ok
    ]
    checks["tensor_types"] = tensor_types(path)
    checks["summary"] = (
        f"runs in llama.cpp: logits within {checks['max_logit_difference_relative']:.2g} of the f16 file's "
        f"(bound {checks['bound']}), KL {checks['kl_divergence_max']:.2g}, top-1 agreement "
        f"{checks['top1_agreement']:.0%}; prompt ids {'equal' if all(checks['prompt_ids_equal']) else 'DIFFER'}; "
        f"stops at {', '.join(checks['stops'])}; tensors "
        + ", ".join(f"{count} {name}" for name, count in checks["tensor_types"].items())
        + _fallback_note(gguf_type, checks["tensor_types"])
    )
    return ArtifactProof(artifact=artifact, ok=not failures, checks=checks, failures=failures)


def context_for(prompts: list[Any]) -> int:
    """A llama.cpp context that holds the longest reference prefix and the greedy tokens after a prompt."""
    longest = max(len(p.prompt_ids) + max(len(p.reference_ids), GREEDY_TOKENS) for p in prompts)
    return max(256, longest + 8)


def tensor_types(path: Path) -> dict[str, int]:
    """How many of the file's tensors llama.cpp stored in each type, from the header's tensor table. The key/value
    section before it is stepped over, not decoded: gguf.GGUFReader decodes every token string and merge, a minute
    on Llama 3's 128k vocabulary (the proof spent most of its time there)."""
    import mmap
    from collections import Counter

    import gguf

    counts: Counter[str] = Counter()
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        _version, tensors, kv_count = struct.unpack_from("<IQQ", data, 4)
        offset = 24
        for _ in range(kv_count):
            offset = _after_string(data, offset)
            (value_type,) = struct.unpack_from("<I", data, offset)
            offset = _after_value(data, offset + 4, value_type)
        for _ in range(tensors):
            offset = _after_string(data, offset)
            (dims,) = struct.unpack_from("<I", data, offset)
            (kind,) = struct.unpack_from("<I", data, offset + 4 + 8 * dims)
            counts[gguf.GGMLQuantizationType(kind).name] += 1
            offset += 4 + 8 * dims + 4 + 8  # n_dims, dims, type, data offset
    return dict(sorted(counts.items()))


# GGUF's fixed-size value types (gguf.GGUFValueType) and their sizes; 8 is a string, 9 an array.
_VALUE_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


def _after_string(data: Any, offset: int) -> int:
    (length,) = struct.unpack_from("<Q", data, offset)
    return offset + 8 + length


def _after_value(data: Any, offset: int, value_type: int) -> int:
    if value_type == _STRING:
        return _after_string(data, offset)
    if value_type != _ARRAY:
        return offset + _VALUE_SIZES[value_type]
    element_type, count = struct.unpack_from("<IQ", data, offset)
    offset += 12
    if element_type in _VALUE_SIZES:
        return offset + count * _VALUE_SIZES[element_type]
    for _ in range(count):
        offset = _after_value(data, offset, element_type)
    return offset


def _fallback_note(gguf_type: str, types: dict[str, int]) -> str:
    """llama.cpp stores a matrix whose rows are not a multiple of 256 (a k-quant's block) in a 32-wide type instead
    (q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0): said, since such a file is not the k-quant its name says."""
    kind = gguf_type.split("_")[0].upper() + "_K"
    if types.get(kind):
        return ""
    return f" (no {kind} tensor: every matrix's rows are narrower than or not a multiple of 256, which llama.cpp then quantizes to the 32-wide types)"


def _positions(prompts: list[Any]) -> list[list[int]]:
    """Each reference position's prefix: a prompt, then the prompt with its first reference tokens."""
    return [
        [*p.prompt_ids, *p.reference_ids[:extra]]
        for p in prompts
        for extra in range(min(POSITIONS, len(p.reference_ids) + 1))
    ]


def _distribution(quantized: Any, reference: Any, prompts: list[Any]) -> dict[str, float]:
    worst, kl, agree, prefixes = 0.0, 0.0, 0, _positions(prompts)
    for ids in prefixes:
        got, want = quantized.next_logits(ids), reference.next_logits(ids)
        worst = max(worst, float(np.abs(got - want).max()) / max(1.0, float(np.abs(want).max())))
        kl = max(kl, _kl(want, got))
        agree += int(np.argmax(got) == np.argmax(want))
    return {
        "max_logit_difference_relative": worst,
        "kl_divergence_max": kl,
        "top1_agreement": agree / len(prefixes),
        "positions": len(prefixes),
    }


def _kl(reference: np.ndarray, other: np.ndarray) -> float:
    """KL(p_reference || p_other) in nats, from logits."""
    p_log = reference.astype(np.float64) - np.logaddexp.reduce(reference.astype(np.float64))
    q_log = other.astype(np.float64) - np.logaddexp.reduce(other.astype(np.float64))
    return float(np.sum(np.exp(p_log) * (p_log - q_log)))


def _same_ids(model: Any, tokenizer: Any, prompts: list[Any]) -> list[bool]:
    """Per text: llama.cpp's ids equal transformers' ids for the same text. The texts: each validation prompt's,
    decoded, where transformers reads that text back to the prompt's own ids (a SentencePiece decode adds a space
    after a special token, which neither tokenizer would have seen: such a text is left out), and two probe
    conversations rendered with the run's chat template."""
    from seqtune.export.modelfile import CONVERSATIONS

    texts = []
    for prompt in prompts:
        text = tokenizer.decode(prompt.prompt_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if tokenizer(text, add_special_tokens=False)["input_ids"] == prompt.prompt_ids:
            texts.append(text)
    if tokenizer.chat_template:
        texts += [
            str(tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)) for c in CONVERSATIONS
        ]
    return [model.tokenize(text) == tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
