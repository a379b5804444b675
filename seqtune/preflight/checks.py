"""Preflight checks: one small pure function per invariant, each returning the problems it found.

Every check takes plain values (ints, arrays, lists of strings), so each one can be made to fail and pass in a
unit test without a tokenizer, a model or data. `runner.py` gathers those values from the real packages.
A Problem always names the config key, the values, the broken relation and the fix: a misconfiguration is
never only a warning, and every problem makes preflight fail.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from seqtune.data.stream import POLICY_REJECTS as STREAM_POLICY_REJECTS
from seqtune.data.types import Reject
from seqtune.models.lora import unmatched_targets

# Strategies whose every micro-batch must be exactly [batch_size, max_seq_len].
FIXED_SHAPE_STRATEGIES = ("max_length",)
# Attention backends that keep packed documents apart (position_ids / varlen boundaries reset per document).
PACKING_SAFE_ATTENTION = ("flash_attention_2", "sdpa", "eager")
# How many offenders a message lists before "and N more": enough to find them, short enough to read.
MAX_LISTED = 5
# model.resize_embeddings rounds the new embedding size up to this (tensor-core friendly shapes).
RESIZE_MULTIPLE = 64


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One broken invariant. `message` names the values and the relation and ends with the fix."""

    check: str
    key: str
    message: str
    # "file:line" of the offending record where there is one.
    location: str | None = None


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def resized_vocab(tokenizer_size: int, embedding_rows: int = 0) -> int:
    """The embedding size model.resize_embeddings=true gives: the tokenizer's rounded up to a multiple of 64,
    never fewer rows than the model has (the same rule as seqtune.models.resized_rows)."""
    return max(embedding_rows, round_up(tokenizer_size, RESIZE_MULTIPLE))


def _listed(items: Sequence[str], total: int) -> str:
    text = ", ".join(items[:MAX_LISTED])
    more = total - min(len(items), MAX_LISTED)
    return f"{text} and {more} more" if more > 0 else text


# --- 1. vocabulary ------------------------------------------------------------------------------------------


def check_vocab_size(
    *, tokenizer_size: int, embedding_rows: int, output_rows: int, resize_embeddings: bool
) -> list[Problem]:
    """The tokenizer's full vocabulary (added + special tokens) must fit the input embedding and the output head.

    An id >= the embedding rows indexes out of range: on CUDA a device-side assert a few steps in (report 4).
    """
    if resize_embeddings:
        return []
    problems = []
    for what, rows in (("input embedding", embedding_rows), ("output head", output_rows)):
        if tokenizer_size > rows:
            resized = resized_vocab(tokenizer_size, rows)
            problems.append(Problem(
                check="vocab", key="model.resize_embeddings",
                message=(f"tokenizer has {tokenizer_size} tokens (added and special included) > model {what} "
                         f"rows {rows} (model.vocab_size); ids {rows}..{tokenizer_size - 1} would index out of "
                         f"range. Fix: model.resize_embeddings=true (resizes to {resized}), "
                         "or the tokenizer that matches the model (tokenizer=checkpoint)."),
            ))
    return problems


def check_special_token_ids(*, special_ids: Mapping[str, int | None], vocab_rows: int) -> list[Problem]:
    """Every special token the model will see (bos, eos, pad, chat-template tokens) has an embedding row."""
    problems = []
    for name, token_id in special_ids.items():
        if token_id is not None and not 0 <= token_id < vocab_rows:
            problems.append(Problem(
                check="vocab", key="model.resize_embeddings",
                message=(f"special token {name} has id {token_id}, outside the model's embedding rows "
                         f"[0, {vocab_rows}). Fix: model.resize_embeddings=true, or the tokenizer that matches "
                         "the model (tokenizer=checkpoint)."),
            ))
    return problems


def check_max_token_id(
    *, split: str, max_token_id: int, location: str | None, vocab_rows: int, pretokenized: bool
) -> list[Problem]:
    """The largest id actually produced over a split (or found in pre-tokenized input_ids) has an embedding row."""
    if max_token_id < vocab_rows:
        return []
    if pretokenized:
        fix = (f"re-tokenize data.{split} with the model's tokenizer, or model.resize_embeddings=true if those "
               "ids are intended")
        key = f"data.{split}"
    else:
        fix = "model.resize_embeddings=true, or the tokenizer that matches the model (tokenizer=checkpoint)"
        key = "model.resize_embeddings"
    where = f" ({location})" if location else ""
    return [Problem(
        check="vocab", key=key, location=location,
        message=(f"{split} data contains token id {max_token_id}{where} >= model embedding rows {vocab_rows}. "
                 f"Fix: {fix}."),
    )]


# --- 2. pad token -------------------------------------------------------------------------------------------


def check_pad_token(*, pad_id: int | None, pad_policy: str) -> list[Problem]:
    """Batches of different lengths need a pad id; the tokenizer's pad_policy decides where it comes from."""
    if pad_id is not None:
        return []
    return [Problem(
        check="pad", key="tokenizer.pad_policy",
        message=(f"the tokenizer has no pad token and tokenizer.pad_policy={pad_policy}. "
                 "Fix: tokenizer.pad_policy=eos (padding is masked by the attention and label masks, never by id), "
                 "or tokenizer.pad_policy=add with model.resize_embeddings=true."),
    )]


def pad_token_notes(*, pad_id: int | None, eos_id: int | None) -> list[str]:
    """Information, not a problem: pad == eos is safe because collators mask padding by position, not by id."""
    if pad_id is not None and pad_id == eos_id:
        return [f"pad token id {pad_id} == eos id: padding is masked by the attention and label masks, so the "
                "final eos of every sample still trains."]
    return []


# --- 3. sequence length -------------------------------------------------------------------------------------


def resolve_max_seq_len(requested: int | str, longest: int) -> int:
    """`auto` = the longest sample over ALL splits, rounded up to a multiple of 8; an integer stays as given."""
    if requested == "auto":
        return round_up(max(longest, 1), 8)
    return int(requested)


def check_context_length(
    *, max_seq_len: int, context_length: int, auto: bool, longest_location: str | None = None
) -> list[Problem]:
    """max_seq_len (auto or explicit) above the model's context is an error: it is never silently raised."""
    if max_seq_len <= context_length:
        return []
    if auto:
        where = f" ({longest_location})" if longest_location else ""
        message = (f"data.max_seq_len=auto resolves to {max_seq_len} (longest sample{where}) > model context "
                   f"length {context_length}. Fix: data.max_seq_len={context_length} with data.overlength=truncate "
                   "or data.overlength=drop.")
    else:
        message = (f"data.max_seq_len={max_seq_len} > model context length {context_length}. "
                   f"Fix: data.max_seq_len={context_length} (or less), or data.max_seq_len=auto.")
    return [Problem(check="length", key="data.max_seq_len", message=message, location=longest_location)]


def check_overlength(
    *, split: str, lengths: np.ndarray, locations: Sequence[str], max_seq_len: int, policy: str
) -> list[Problem]:
    """With data.overlength=error, every sample of every split fits max_seq_len (report 5: val longer than train).

    truncate and drop are explicit policies: their counts are reported in the split stats, not as problems.
    """
    over = np.flatnonzero(np.asarray(lengths) > max_seq_len)
    if policy != "error" or over.size == 0:
        return []
    order = over[np.argsort(-np.asarray(lengths)[over], kind="stable")]
    longest = int(order[0])
    listed = [f"{locations[i]} ({int(lengths[i])} tokens > {max_seq_len})" for i in order[:MAX_LISTED]]
    return [Problem(
        check="length", key="data.max_seq_len", location=locations[longest],
        message=(f"data.max_seq_len={max_seq_len} < longest {split} sample {int(lengths[longest])} tokens "
                 f"({locations[longest]}); {over.size} {split} sample(s) over the limit: "
                 f"{_listed(listed, int(over.size))}. Fix: data.max_seq_len=auto, or data.overlength=truncate "
                 "(or drop)."),
    )]


def length_stats(lengths: np.ndarray, max_seq_len: int) -> dict[str, int]:
    """min / median / p99 / max of a split's token lengths and how many exceed max_seq_len."""
    values = np.asarray(lengths)
    if values.size == 0:
        return {"min": 0, "median": 0, "p99": 0, "max": 0, "over_limit": 0}
    return {
        "min": int(values.min()), "median": int(np.median(values)),
        "p99": int(np.percentile(values, 99, method="higher")), "max": int(values.max()),
        "over_limit": int((values > max_seq_len).sum()),
    }


# --- 4. labels ----------------------------------------------------------------------------------------------


def check_trainable_tokens(
    *, split: str, zero_target: int, locations: Sequence[str], dropped: bool
) -> list[Problem]:
    """A sample whose only target is the final eos (every completion token masked, e.g. an empty output or a
    prompt that truncation cut the completion from) teaches nothing but when to stop: counted, and a problem
    unless such samples are dropped. `locations` = the first few of them."""
    if zero_target == 0 or dropped:
        return []
    return [Problem(
        check="labels", key="data.train_on_prompt", location=locations[0] if locations else None,
        message=(f"{zero_target} {split} sample(s) have zero trainable tokens (every completion token masked): "
                 f"{_listed(list(locations), zero_target)}. Fix: give them a non-empty completion, "
                 "data.train_on_prompt=true, or a larger data.max_seq_len if truncation cut the completion."),
    )]


def trainable_fraction(num_targets: np.ndarray, lengths: np.ndarray) -> float:
    total = int(np.asarray(lengths).sum())
    return float(np.asarray(num_targets).sum()) / total if total else 0.0


# --- 5. padding / shape contract ----------------------------------------------------------------------------


def check_batch_shapes(
    *, label: str, shapes: Mapping[str, tuple[int, ...]], strategy: str, max_seq_len: int,
    expected_rows: int | None,
) -> list[Problem]:
    """One collated batch: every [B, T] tensor has one shape; fixed-shape strategies give [batch, max_seq_len].

    This is the contract whose breach is report 2 (`expected sequence of length 4096 at dim 1 (got 3999)`).
    """
    matrices = {name: tuple(shape) for name, shape in shapes.items() if len(shape) == 2}
    if not matrices:
        return [Problem(check="padding", key="padding.strategy",
                        message=f"padding.strategy={strategy} produced no [batch, length] tensors for the {label}. "
                                "Fix: padding.strategy=longest.")]
    distinct = sorted(set(matrices.values()))
    if len(distinct) > 1:
        listed = ", ".join(f"{name} {list(shape)}" for name, shape in sorted(matrices.items()))
        return [Problem(check="padding", key="padding.strategy",
                        message=f"padding.strategy={strategy}: tensors of the {label} differ in shape ({listed}). "
                                "Fix: padding.strategy=longest (or report this collator bug).")]
    rows, width = distinct[0]
    problems = []
    if strategy in FIXED_SHAPE_STRATEGIES and (width != max_seq_len or (expected_rows and rows != expected_rows)):
        problems.append(Problem(
            check="padding", key="padding.strategy",
            message=(f"padding.strategy={strategy} must give [{expected_rows or rows}, {max_seq_len}] but the "
                     f"{label} is [{rows}, {width}]. Fix: padding.strategy=longest, or check data.max_seq_len.")))
    elif width > max_seq_len:
        problems.append(Problem(
            check="padding", key="data.max_seq_len",
            message=(f"padding.strategy={strategy}: the {label} is {width} tokens wide > data.max_seq_len="
                     f"{max_seq_len}. Fix: data.overlength=truncate, or data.max_seq_len=auto.")))
    return problems


def check_packed_attention(*, strategy: str, attn_implementation: str) -> list[Problem]:
    """Packed rows hold several documents: only backends that honour per-document positions keep them apart."""
    if strategy != "packed" or attn_implementation in PACKING_SAFE_ATTENTION:
        return []
    return [Problem(
        check="padding", key="model.attn_implementation",
        message=(f"padding.strategy=packed needs an attention backend that keeps packed documents apart "
                 f"({', '.join(PACKING_SAFE_ATTENTION)}), got model.attn_implementation={attn_implementation}. "
                 "Fix: model.attn_implementation=sdpa, or padding.strategy=longest."),
    )]


def prepadded_notes(*, split: str, count: int, locations: Sequence[str], strategy: str) -> list[str]:
    """Pre-tokenized rows that arrived already padded (report 2: `padding=True` per map batch gives rows of 4096
    and 3999). The parser strips that padding (attention_mask, else pad-id runs), so padding.strategy alone decides
    the shapes; rows whose mask is not plain padding are rejected (wrong_type) and counted by check_bad_lines."""
    if count == 0:
        return []
    return [f"{count} pre-tokenized {split} row(s) arrived already padded (first: {_listed(list(locations), count)}); "
            f"their padding was stripped and padding.strategy={strategy} pads every batch to one shape."]


# --- 6. data integrity --------------------------------------------------------------------------------------

# Reject codes that are an explicit policy (data.overlength=drop), not a malformed line (stream mode agrees).
POLICY_REJECTS = STREAM_POLICY_REJECTS


def reject_counts(rejects: Sequence[Reject]) -> dict[str, int]:
    """How many records were skipped, per reason code (bad_json, missing_media, ...)."""
    return dict(Counter(reject.code for reject in rejects))


def check_bad_lines(
    *, split: str, rejects: Sequence[Reject], total_lines: int, max_bad_fraction: float
) -> list[Problem]:
    """Malformed lines are skipped and written to rejects.jsonl; above data.max_bad_fraction preflight fails."""
    bad = [reject for reject in rejects if reject.code not in POLICY_REJECTS]
    if not bad:
        return []
    fraction = len(bad) / max(total_lines, 1)
    if fraction <= max_bad_fraction:
        return []
    per_reason = ", ".join(f"{code} x{count}" for code, count in sorted(reject_counts(bad).items()))
    listed = [f"{reject.file}:{reject.line} ({reject.reason})" for reject in bad[:MAX_LISTED]]
    first = f"{bad[0].file}:{bad[0].line}"
    skip = f"data.max_bad_fraction={_fraction_fix(fraction)} to skip them"
    if all(reject.code == "template_rejected" for reject in bad):  # the lines are fine JSON: the template refuses
        key, what, fix = ("tokenizer.chat_template", "refused by the chat template",
                          f"a chat template that renders these conversations (tokenizer.chat_template=...), "
                          f"conversations in the shape it expects, or {skip}")
    else:
        key, what, fix = "data.max_bad_fraction", "malformed", f"repair those lines, or {skip}"
    return [Problem(
        check="integrity", key=key, location=first,
        message=(f"{len(bad)} of {total_lines} {split} lines are {what} ({fraction:.2%} > "
                 f"data.max_bad_fraction={max_bad_fraction}): {per_reason}; {_listed(listed, len(bad))}. "
                 f"All are listed in rejects.jsonl. Fix: {fix}."),
    )]


def check_split_not_empty(
    *, split: str, files: Sequence[str], records: int, samples: int, kept: int, reject_counts: Mapping[str, int],
    first_reject: Reject | None, overlength: str,
) -> list[Problem]:
    """A configured split must give at least one sample after every policy: an empty train split would otherwise
    pass preflight and fail after the model is built, blaming the batch size; an empty val split would
    evaluate nothing. `kept`: samples left after data.overlength."""
    if kept > 0:
        return []
    named = _listed(list(files), len(files))
    skip = "" if split == "train" else f", or data.{split}=null to run without a {split} split"
    if records == 0:
        return [Problem(check="integrity", key=f"data.{split}",
                        message=(f"data.{split} has no records: {named} hold(s) nothing but blank lines (or nothing "
                                 f"at all). Fix: point data.{split} at JSON Lines with records{skip}."))]
    if samples == 0:
        per_reason = ", ".join(f"{code} x{count}" for code, count in sorted(reject_counts.items()))
        first = f" (the first: {first_reject.file}:{first_reject.line}: {first_reject.reason})" if first_reject else ""
        return [Problem(check="integrity", key=f"data.{split}", location=first_reject and
                        f"{first_reject.file}:{first_reject.line}",
                        message=(f"data.{split} has no usable record: all {records} were rejected ({per_reason})"
                                 f"{first}; every one is listed in rejects.jsonl. Fix: repair them{skip}."))]
    return [Problem(check="length", key="data.overlength",
                    message=(f"data.overlength={overlength} leaves no {split} sample: all {samples} are longer than "
                             f"data.max_seq_len. Fix: a larger data.max_seq_len (or auto), or "
                             "data.overlength=truncate."))]


def _fraction_fix(fraction: float) -> str:
    # The smallest "round" value that lets this run through; printed, so keep it short.
    return f"{np.ceil(fraction * 1000) / 1000:.3f}".rstrip("0").rstrip(".")


# --- 7. distributed plan ------------------------------------------------------------------------------------


def check_epoch_steps(
    *, split: str, num_items: int, micro_batches_per_rank: int, steps_per_epoch: int | None, batch_size: int,
    world_size: int, grad_accum: int,
) -> list[Problem]:
    """Every rank runs the same number of micro-batches; an epoch with zero of them (or zero steps) is an error.

    steps_per_epoch is None for evaluation splits (no optimizer step).
    """
    needed = batch_size * world_size * (grad_accum if steps_per_epoch is not None else 1)
    if micro_batches_per_rank > 0 and (steps_per_epoch is None or steps_per_epoch > 0):
        return []
    what = "optimizer steps" if micro_batches_per_rank > 0 else "micro-batches"
    return [Problem(
        check="plan", key="train.batch_size",
        message=(f"{split}: {num_items} samples/rows give zero {what} per rank per epoch: one "
                 f"{'step' if steps_per_epoch is not None else 'micro-batch on every rank'} needs "
                 f"train.batch_size={batch_size} x world size {world_size}"
                 f"{f' x train.grad_accum={grad_accum}' if steps_per_epoch is not None else ''} = {needed}. "
                 f"Fix: a smaller train.batch_size or train.grad_accum, fewer ranks (launcher.nproc_per_node), "
                 "more data, or data.tail=pad."),
    )]


# --- 8. LoRA and backends -----------------------------------------------------------------------------------


def lora_candidate_names(linear_module_names: Sequence[str]) -> list[str]:
    """The leaf names lora.target_modules can use (q_proj, ...), from the model's Linear modules' full names."""
    return sorted({name.rsplit(".", 1)[-1] for name in linear_module_names})


def check_lora_targets(
    *, enabled: bool, targets: Sequence[str], linear_module_names: Sequence[str], defaults: Sequence[str] = ()
) -> list[Problem]:
    """Every lora.target_modules entry must match a Linear module (peft's rule: the full name or its suffix)."""
    if not enabled:
        return []
    missing = unmatched_targets(targets, linear_module_names)
    if not missing and targets:
        return []
    valid = lora_candidate_names(linear_module_names)
    what = f"lora.target_modules {missing} match no module" if missing else "lora.target_modules is empty"
    return [Problem(
        check="lora", key="lora.target_modules",
        message=(f"{what} of the model. Valid names: {', '.join(valid)}. "
                 f"Fix: lora.target_modules=null (the family's defaults{f': {list(defaults)}' if defaults else ''}), "
                 "or names from that list."),
    )]


def check_backend(
    *, load_in_4bit: bool, attn_implementation: str, compute_dtype: str, device: str, cuda_available: bool,
    flash_attn_installed: bool, bitsandbytes_installed: bool,
) -> list[Problem]:
    """QLoRA and flash-attention need CUDA, their package and a 16-bit dtype: refuse them up front, with the fix."""
    problems = []
    if device == "cuda" and not cuda_available:
        problems.append(Problem(check="backend", key="train.device",
                                message="train.device=cuda but no CUDA device is available. Fix: train.device=auto."))
    if load_in_4bit and not cuda_available:
        problems.append(Problem(check="backend", key="model.load_in_4bit",
                                message="model.load_in_4bit=true (QLoRA) needs a CUDA device; none is available. "
                                        "Fix: model.load_in_4bit=false, or run on a CUDA GPU."))
    elif load_in_4bit and not bitsandbytes_installed:
        problems.append(Problem(check="backend", key="model.load_in_4bit",
                                message="model.load_in_4bit=true (QLoRA) needs bitsandbytes, which is not installed. "
                                        "Fix: pip install -e '.[cuda]', or model.load_in_4bit=false."))
    if attn_implementation != "flash_attention_2":
        return problems
    if not cuda_available:
        reason = "a CUDA device; none is available"
    elif not flash_attn_installed:
        reason = "the flash-attn package, which is not installed (pip install -e '.[cuda]' --no-build-isolation)"
    elif compute_dtype not in ("bfloat16", "float16"):
        reason = (f"bfloat16 or float16 compute, got {compute_dtype} (set model.dtype=bfloat16 or "
                  "train.mixed_precision=bf16)")
    else:
        return problems
    problems.append(Problem(check="backend", key="model.attn_implementation",
                            message=f"model.attn_implementation=flash_attention_2 needs {reason}. "
                                    "Fix: model.attn_implementation=auto (sdpa where flash-attn cannot run)."))
    return problems


# --- 9. memory ----------------------------------------------------------------------------------------------


def check_memory(*, estimate_gib: float, device_memory_gib: float | None, breakdown: str) -> list[Problem]:
    """Worst-case batch memory vs the device's; with no device (CPU) the estimate is only reported."""
    if device_memory_gib is None or estimate_gib <= device_memory_gib:
        return []
    return [Problem(
        check="memory", key="train.batch_size",
        message=(f"estimated peak memory {estimate_gib:.1f} GiB ({breakdown}) > device memory "
                 f"{device_memory_gib:.1f} GiB. Fix: a smaller train.batch_size with a larger train.grad_accum, "
                 "model.gradient_checkpointing=true, a smaller data.max_seq_len, or lora.enabled=true."),
    )]
