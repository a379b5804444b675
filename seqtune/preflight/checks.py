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
from typing import Protocol

import numpy as np

from seqtune.config.recipe_spec import RecipeSpec, Reference
from seqtune.data.batching import round_up
from seqtune.data.types import POLICY_REJECTS, TEMPLATE_REJECTED, Reject
from seqtune.models.attention import PACKING_SAFE_ATTENTION
from seqtune.models.spec import resized_rows, unmatched_targets
from seqtune.tokenizers.templates import with_tool_definitions, with_tool_turns

# How many offenders a message lists before "and N more": enough to find them, short enough to read.
MAX_LISTED = 5
# data.max_seq_len=auto is called out when the longest sample is more than this many times the 99th percentile.
OUTLIER_FACTOR = 2


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One broken invariant. `message` names the values and the relation and ends with the fix."""

    check: str
    key: str
    message: str
    # "file:line" of the offending record where there is one.
    location: str | None = None


def _listed(items: Sequence[str], total: int) -> str:
    text = ", ".join(items[:MAX_LISTED])
    more = total - min(len(items), MAX_LISTED)
    return f"{text} and {more} more" if more > 0 else text


# --- 1. vocabulary ------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class VocabFix:
    """The ways this run can give every token id a row, each one a fix that passes when applied (a vocab problem
    used to offer model.resize_embeddings=true to a recipe that refuses it)."""

    can_resize: bool  # the recipe can grow its embedding (RecipeSpec.resizes_embeddings)
    tiny: bool  # no model.path: the tiny model's model.vocab_size can cover the tokenizer

    @property
    def key(self) -> str:
        """The setting the first fix changes."""
        return "model.resize_embeddings" if self.can_resize else "model.vocab_size" if self.tiny else "tokenizer"

    def text(self, *, rows: int, needed: int) -> str:
        """The fix for a model of `rows` rows where the ids need `needed`."""
        grown = resized_rows(rows, needed)
        fixes = [f"model.resize_embeddings=true (resizes to {grown})"] if self.can_resize else []
        if self.tiny:
            fixes.append(f"model.vocab_size={grown} (a tiny model sized for this tokenizer)")
        else:
            fixes.append("the tokenizer that matches the model (tokenizer=checkpoint)")
        return ", or ".join(fixes)


def check_vocab_size(
    *,
    tokenizer_size: int,
    embedding_rows: int,
    output_rows: int,
    resize_embeddings: bool,
    fix: VocabFix,
    special_ids: Mapping[str, int | None] | None = None,
) -> list[Problem]:
    """The tokenizer's full vocabulary (added + special tokens) must fit the input embedding and the output head.

    An id >= the embedding rows indexes out of range: on CUDA a device-side assert a few steps in (report 4).
    One problem for one cause: the special tokens it leaves without a row are counted in it, not listed apart.
    """
    short = [
        (what, rows)
        for what, rows in (("input embedding", embedding_rows), ("output head", output_rows))
        if tokenizer_size > rows
    ]
    if resize_embeddings or not short:
        return []
    rows = min(r for _, r in short)
    parts = " and ".join(f"{what} rows {r}" for what, r in short)
    outside = _out_of_range(special_ids or {}, rows)
    specials = f"; {len(outside)} special token(s) among them: {_listed(outside, len(outside))}" if outside else ""
    return [
        Problem(
            check="vocab",
            key=fix.key,
            message=(
                f"tokenizer has {tokenizer_size} tokens (added and special included) > model {parts} "
                f"(model.vocab_size); ids {rows}..{tokenizer_size - 1} would index out of range{specials}. "
                f"Fix: {fix.text(rows=rows, needed=tokenizer_size)}."
            ),
        )
    ]


def _out_of_range(special_ids: Mapping[str, int | None], vocab_rows: int) -> list[str]:
    """`name (id)` per special id without a row, each id once (a token's text wins over its role: eos, pad...)."""
    outside = {
        token_id: name
        for name, token_id in special_ids.items()
        if token_id is not None and not 0 <= token_id < vocab_rows
    }
    return [f"{name} ({token_id})" for token_id, name in sorted(outside.items())]


def check_special_token_ids(*, special_ids: Mapping[str, int | None], vocab_rows: int, fix: VocabFix) -> list[Problem]:
    """Every special token the model will see (bos, eos, pad, chat-template tokens) has an embedding row.

    One problem for all of them (a vocabulary of 256 reserved tokens is one mistake, not 256)."""
    outside = _out_of_range(special_ids, vocab_rows)
    if not outside:
        return []
    return [
        Problem(
            check="vocab",
            key=fix.key,
            message=(
                f"{len(outside)} special token(s) have ids outside the model's embedding rows [0, {vocab_rows}): "
                f"{_listed(outside, len(outside))}. Fix: "
                f"{fix.text(rows=vocab_rows, needed=1 + max(i for i in special_ids.values() if i is not None))}."
            ),
        )
    ]


def check_max_token_id(
    *, split: str, max_token_id: int, location: str | None, vocab_rows: int, pretokenized: bool, fix: VocabFix
) -> list[Problem]:
    """The largest id actually produced over a split (or found in pre-tokenized input_ids) has an embedding row."""
    if max_token_id < vocab_rows:
        return []
    ways = fix.text(rows=vocab_rows, needed=max_token_id + 1)
    if pretokenized:
        text = f"re-tokenize data.{split} with the model's tokenizer, or {ways} if those ids are intended"
        key = f"data.{split}"
    else:
        text, key = ways, fix.key
    where = f" ({location})" if location else ""
    return [
        Problem(
            check="vocab",
            key=key,
            location=location,
            message=(
                f"{split} data contains token id {max_token_id}{where} >= model embedding rows {vocab_rows}. "
                f"Fix: {text}."
            ),
        )
    ]


# --- 2. pad token (the tokenizer loader applies tokenizer.pad_policy, refusing `error` without a pad) ----------


def pad_token_notes(*, pad_id: int | None, eos_id: int | None) -> list[str]:
    """Information, not a problem: pad == eos is safe because collators mask padding by position, not by id."""
    if pad_id is not None and pad_id == eos_id:
        return [
            f"pad token id {pad_id} == eos id: padding is masked by the attention and label masks, so the "
            "final eos of every sample still trains."
        ]
    return []


# --- 3. sequence length -------------------------------------------------------------------------------------


def resolve_max_seq_len(requested: int | str, longest: int) -> int:
    """`auto` = the longest sample over ALL splits, rounded up to a multiple of 8; an integer stays as given."""
    if requested == "auto":
        return round_up(max(longest, 1), 8)
    return int(requested)


def auto_length_notes(*, lengths: np.ndarray, max_seq_len: int, longest_location: str | None) -> list[str]:
    """data.max_seq_len=auto follows the single longest sample. When that sample is far above the rest (over
    OUTLIER_FACTOR x the 99th percentile), say so and name the fixed length that fits the data instead: the
    outlier sizes memory, max_length/packed rows and the plan."""
    values = np.asarray(lengths)
    if values.size == 0:
        return []
    p99 = int(np.percentile(values, 99, method="higher"))
    longest = int(values.max())
    if longest <= OUTLIER_FACTOR * p99:
        return []
    cap = round_up(p99, 8)
    over = int((values > cap).sum())
    where = f", {longest_location}" if longest_location else ""
    return [
        f"data.max_seq_len=auto is {max_seq_len}, set by the longest sample ({longest} tokens{where}), while 99% "
        f"of samples have at most {p99} tokens and {over} sample(s) exceed {cap}. Memory, padded rows and the "
        f"plan are sized for that outlier. To size them for the data: data.max_seq_len={cap} "
        f"data.overlength=drop (drops those {over}), or data.overlength=truncate to keep their beginning."
    ]


def check_context_length(
    *, max_seq_len: int, context_length: int, auto: bool, longest_location: str | None = None
) -> list[Problem]:
    """max_seq_len (auto or explicit) above the model's context is an error: it is never silently raised."""
    if max_seq_len <= context_length:
        return []
    if auto:
        where = f" ({longest_location})" if longest_location else ""
        message = (
            f"data.max_seq_len=auto resolves to {max_seq_len} (longest sample{where}) > model context "
            f"length {context_length}. Fix: data.max_seq_len={context_length} with data.overlength=truncate "
            "or data.overlength=drop."
        )
    else:
        message = (
            f"data.max_seq_len={max_seq_len} > model context length {context_length}. "
            f"Fix: data.max_seq_len={context_length} (or less), or data.max_seq_len=auto."
        )
    return [Problem(check="length", key="data.max_seq_len", message=message, location=longest_location)]


class SampleLocations(Protocol):
    """file:line of sample i: a list, or a lazy view of a token cache (phases._Locations: 100M samples)."""

    def __getitem__(self, i: int, /) -> str: ...


def check_overlength(
    *,
    split: str,
    lengths: np.ndarray,
    locations: SampleLocations,
    max_seq_len: int,
    policy: str,
    noun: str = "sample",
) -> list[Problem]:
    """With data.overlength=error, every sample of every split fits max_seq_len (report 5: val longer than train).
    `lengths`: per sample (a pair's longer sequence), `noun`: what a sample is called (its sample kind's noun, seqtune.data.kinds).

    truncate and drop are explicit policies: their counts are reported in the split stats, not as problems.
    """
    over = np.flatnonzero(np.asarray(lengths) > max_seq_len)
    if policy != "error" or over.size == 0:
        return []
    order = over[np.argsort(-np.asarray(lengths)[over], kind="stable")]
    longest = int(order[0])
    listed = [f"{locations[i]} ({int(lengths[i])} tokens > {max_seq_len})" for i in order[:MAX_LISTED]]
    return [
        Problem(
            check="length",
            key="data.max_seq_len",
            location=locations[longest],
            message=(
                f"data.max_seq_len={max_seq_len} < longest {split} {noun} {int(lengths[longest])} tokens "
                f"({locations[longest]}); {over.size} {split} {noun}(s) over the limit: "
                f"{_listed(listed, int(over.size))}. Fix: data.max_seq_len=auto, or data.overlength=truncate "
                "(or drop)."
            ),
        )
    ]


def length_stats(lengths: np.ndarray, max_seq_len: int) -> dict[str, int]:
    """min / median / p99 / max of a split's token lengths and how many exceed max_seq_len."""
    values = np.asarray(lengths)
    if values.size == 0:
        return {"min": 0, "median": 0, "p99": 0, "max": 0, "over_limit": 0}
    return {
        "min": int(values.min()),
        "median": int(np.median(values)),
        "p99": int(np.percentile(values, 99, method="higher")),
        "max": int(values.max()),
        "over_limit": int((values > max_seq_len).sum()),
    }


# --- 4. labels ----------------------------------------------------------------------------------------------


def check_trainable_tokens(*, split: str, zero_target: int, locations: Sequence[str], dropped: bool) -> list[Problem]:
    """A sample whose only target is the final eos (every completion token masked, e.g. an empty output) teaches
    nothing but when to stop: counted, and a problem unless such samples are dropped. `locations` = the first few.
    (Samples that data.overlength=truncate leaves without a target are dropped in both data modes: a note.)"""
    if zero_target == 0 or dropped:
        return []
    return [
        Problem(
            check="labels",
            key="data.train_on_prompt",
            location=locations[0] if locations else None,
            message=(
                f"{zero_target} {split} sample(s) have zero trainable tokens (every completion token masked): "
                f"{_listed(list(locations), zero_target)}. Fix: give them a non-empty completion, "
                "data.train_on_prompt=true, or a larger data.max_seq_len if truncation cut the completion."
            ),
        )
    ]


def trainable_fraction(num_targets: np.ndarray, lengths: np.ndarray) -> float:
    total = int(np.asarray(lengths).sum())
    return float(np.asarray(num_targets).sum()) / total if total else 0.0


# --- 5. padding / shape contract ----------------------------------------------------------------------------


def check_batch_shapes(
    *,
    label: str,
    shapes: Mapping[str, tuple[int, ...]],
    strategy: str,
    expected: tuple[int, int],
) -> list[Problem]:
    """One collated micro-batch: every [rows, width] tensor has exactly the shape the padding strategy's rule
    (seqtune.data.batching.BatchRule) gives for it.

    This is the contract whose breach is report 2 (`expected sequence of length 4096 at dim 1 (got 3999)`).
    """
    matrices = {name: tuple(shape) for name, shape in shapes.items() if len(shape) == 2}
    if not matrices:
        return [
            Problem(
                check="padding",
                key="padding.strategy",
                message=f"padding.strategy={strategy} produced no [rows, width] tensors for the {label}. "
                "Fix: padding.strategy=longest.",
            )
        ]
    wrong = {name: shape for name, shape in matrices.items() if shape != tuple(expected)}
    if not wrong:
        return []
    listed = ", ".join(f"{name} {list(shape)}" for name, shape in sorted(matrices.items()))
    return [
        Problem(
            check="padding",
            key="padding.strategy",
            message=(
                f"padding.strategy={strategy} must give the {label} the shape {list(expected)} (rows x "
                f"width, by the strategy's rule), but the collator built {listed}. Fix: "
                "padding.strategy=longest (and please report this collator bug)."
            ),
        )
    ]


def check_packed_attention(*, strategy: str, attn_implementation: str) -> list[Problem]:
    """Packed rows hold several documents: only backends that honour per-document positions keep them apart."""
    if strategy != "packed" or attn_implementation in PACKING_SAFE_ATTENTION:
        return []
    return [
        Problem(
            check="padding",
            key="model.attn_implementation",
            message=(
                f"padding.strategy=packed needs an attention backend that keeps packed documents apart "
                f"({', '.join(PACKING_SAFE_ATTENTION)}), got model.attn_implementation={attn_implementation}. "
                "Fix: model.attn_implementation=sdpa, or padding.strategy=longest."
            ),
        )
    ]


def prepadded_notes(*, split: str, count: int, locations: Sequence[str], strategy: str) -> list[str]:
    """Pre-tokenized rows that arrived already padded (report 2: `padding=True` per map batch gives rows of 4096
    and 3999). The parser strips that padding (attention_mask, else pad-id runs), so padding.strategy alone decides
    the shapes; rows whose mask is not plain padding are rejected (wrong_type) and counted by check_bad_lines."""
    if count == 0:
        return []
    return [
        f"{count} pre-tokenized {split} row(s) arrived already padded (first: {_listed(list(locations), count)}); "
        f"their padding was stripped and padding.strategy={strategy} pads every batch to one shape."
    ]


# --- 6. data integrity --------------------------------------------------------------------------------------

# Reject codes that are an explicit policy (data.overlength=drop), not a malformed line (stream mode agrees).


def reject_counts(rejects: Sequence[Reject]) -> dict[str, int]:
    """How many records were skipped, per reason code (bad_json, missing_media, ...)."""
    return dict(Counter(reject.code for reject in rejects))


def check_bad_lines(
    *, split: str, rejects: Sequence[Reject], total_lines: int, max_bad_fraction: float
) -> list[Problem]:
    """Malformed lines are skipped and written to rejects.jsonl; above data.max_bad_fraction preflight fails.

    Conversations the chat template cannot render are their own problem (the fix is the template, named by
    tokenizer.chat_template, not the data); both kinds count towards the fraction.
    """
    bad = [reject for reject in rejects if reject.code not in POLICY_REJECTS]
    if not bad:
        return []
    fraction = len(bad) / max(total_lines, 1)
    if fraction <= max_bad_fraction:
        return []
    skip = f"data.max_bad_fraction={_fraction_fix(fraction)} to skip them"
    unrenderable = [reject for reject in bad if reject.code == TEMPLATE_REJECTED]
    malformed = [reject for reject in bad if reject.code != TEMPLATE_REJECTED]
    problems = []
    if unrenderable:
        tools = with_tool_turns()
        problems.append(
            Problem(
                check="template",
                key="tokenizer.chat_template",
                location=_where(unrenderable[0]),
                message=(
                    f"{len(unrenderable)} of {total_lines} {split} conversations cannot be rendered by the chat "
                    f"template ({fraction:.2%} of lines skipped > data.max_bad_fraction={max_bad_fraction}): "
                    f"{_listed(_described(unrenderable), len(unrenderable))}. All are listed in rejects.jsonl. "
                    f"Fix: tokenizer.chat_template=NAME with a template that renders them (tool turns: {tools}; "
                    f"tool definitions: {with_tool_definitions()}, or a checkpoint's own that "
                    "reads `tools`; or a .jinja file), repair "
                    f"those conversations, or {skip}."
                ),
            )
        )
    if malformed:
        per_reason = ", ".join(f"{code} x{count}" for code, count in sorted(reject_counts(malformed).items()))
        problems.append(
            Problem(
                check="integrity",
                key="data.max_bad_fraction",
                location=_where(malformed[0]),
                message=(
                    f"{len(malformed)} of {total_lines} {split} lines are malformed ({fraction:.2%} of lines "
                    f"skipped > data.max_bad_fraction={max_bad_fraction}): {per_reason}; "
                    f"{_listed(_described(malformed), len(malformed))}. All are listed in rejects.jsonl. "
                    f"Fix: repair those lines, or {skip}."
                ),
            )
        )
    return problems


def _where(reject: Reject) -> str:
    return f"{reject.file}:{reject.line}"


def _described(rejects: Sequence[Reject]) -> list[str]:
    return [f"{_where(reject)} ({reject.reason})" for reject in rejects[:MAX_LISTED]]


def check_split_not_empty(
    *,
    split: str,
    files: Sequence[str],
    records: int,
    samples: int,
    kept: int,
    reject_counts: Mapping[str, int],
    first_reject: Reject | None,
    overlength: str,
    rejects: Sequence[Reject] = (),
    reject_fixes: Mapping[str, tuple[str, str]] | None = None,
) -> list[Problem]:
    """A configured split must give at least one sample after every policy: an empty train split would otherwise
    pass preflight and fail after the model is built, blaming the batch size; an empty val split would
    evaluate nothing. `kept`: samples left after data.overlength."""
    if kept > 0:
        return []
    named = _listed(list(files), len(files))
    skip = "" if split == "train" else f", or data.{split}=null to run without a {split} split"
    if records == 0:
        return [
            Problem(
                check="integrity",
                key=f"data.{split}",
                message=(
                    f"data.{split} has no records: {named} hold(s) nothing but blank lines (or nothing "
                    f"at all). Fix: point data.{split} at JSON Lines with records{skip}."
                ),
            )
        ]
    if samples == 0:
        return [
            _all_rejected(
                split=split,
                records=records,
                reject_counts=reject_counts,
                rejects=rejects,
                first_reject=first_reject,
                skip=skip,
                reject_fixes=reject_fixes or {},
            )
        ]
    return [
        Problem(
            check="length",
            key="data.overlength",
            message=(
                f"data.overlength={overlength} leaves no {split} sample: all {samples} are longer than "
                f"data.max_seq_len. Fix: a larger data.max_seq_len (or auto), or "
                "data.overlength=truncate."
            ),
        )
    ]


# What fixes the records a reject code names, and the key it is about ({split}: the split's key): the codes any
# format's records are rejected with. A split's formats add theirs (seqtune.data.formats.reject_fixes).
REJECT_FIXES: dict[str, tuple[str, str]] = {
    "bad_json": ("data.{split}", "write one JSON object per line (JSON Lines) or one JSON array of objects"),
    "bad_utf8": ("data.{split}", "re-encode the file as UTF-8"),
    "not_object": ("data.{split}", "make each record a JSON object {...} with the format's fields"),
    "empty_text": ("data.{split}", "fill in the empty fields, or drop those records"),
    "missing_media": ("data.media_root", "data.media_root=DIR, the directory the records' media paths are under"),
    "empty_media": ("data.{split}", "put each media file's path between its tags, or remove the empty references"),
    "media_not_file": ("data.{split}", "name the media file itself in each reference, not a directory"),
    "no_targets": ("data.{split}", "give every conversation an assistant reply (and a user turn before it)"),
    "no_user_turn": ("data.{split}", "give every conversation a user message before its assistant reply"),
    "unsupported_content": (
        "data.{split}",
        "keep only text content (images, audio and files do not train a text-only model; an image-text model reads "
        "images: model=gemma3_vision_tiny)",
    ),
    "overlength": ("data.max_seq_len", "a larger data.max_seq_len (or auto), or data.overlength=truncate"),
}


def _template_fix() -> tuple[str, str]:
    """The fix of conversations no template renders (built when needed: it lists the named templates' parses)."""
    return (
        "tokenizer.chat_template",
        f"tokenizer.chat_template=NAME with a template that renders them (tool turns: {with_tool_turns()})",
    )


def _all_rejected(
    *,
    split: str,
    records: int,
    reject_counts: Mapping[str, int],
    rejects: Sequence[Reject],
    first_reject: Reject | None,
    skip: str,
    reject_fixes: Mapping[str, tuple[str, str]],
) -> Problem:
    """Every record of a split rejected: one problem naming the most common reason and what fixes it (raising
    data.max_bad_fraction would only lead to "no usable record")."""
    code, count = max(sorted(reject_counts.items()), key=lambda item: item[1])
    example = next((r for r in rejects if r.code == code), first_reject)
    # the split's formats' own fixes (RecordFormat.reject_fixes) first
    fixes = {**REJECT_FIXES, TEMPLATE_REJECTED: _template_fix(), **reject_fixes}
    key, fix = fixes.get(code, ("data.{split}", "repair those records"))
    others = ", ".join(f"{c} x{n}" for c, n in sorted(reject_counts.items()) if c != code)
    where = f"{example.file}:{example.line}" if example is not None else None
    return Problem(
        check="template" if code == TEMPLATE_REJECTED else "integrity",
        key=key.format(split=split),
        location=where,
        message=(
            f"data.{split} has no usable record: all {records} were rejected, most for {code} ({count} of "
            f"{records}{f'; also {others}' if others else ''})"
            f"{f'; the first: {where}: {example.reason}' if example is not None else ''}. Every one is listed "
            f"in rejects.jsonl. Fix: {fix}{skip}."
        ),
    )


def _fraction_fix(fraction: float) -> str:
    # The smallest "round" value that lets this run through; printed, so keep it short.
    return f"{np.ceil(fraction * 1000) / 1000:.3f}".rstrip("0").rstrip(".")


# --- 7. distributed plan ------------------------------------------------------------------------------------


def check_epoch_steps(
    *,
    split: str,
    num_items: int,
    micro_batches_per_rank: int,
    steps_per_epoch: int | None,
    batch_size: int,
    world_size: int,
    grad_accum: int,
) -> list[Problem]:
    """Every rank runs the same number of micro-batches; an epoch with zero of them (or zero steps) is an error.

    steps_per_epoch is None for evaluation splits (no optimizer step).
    """
    needed = batch_size * world_size * (grad_accum if steps_per_epoch is not None else 1)
    if micro_batches_per_rank > 0 and (steps_per_epoch is None or steps_per_epoch > 0):
        return []
    what = "optimizer steps" if micro_batches_per_rank > 0 else "micro-batches"
    return [
        Problem(
            check="plan",
            key="train.batch_size",
            message=(
                f"{split}: {num_items} samples/rows give zero {what} per rank per epoch: one "
                f"{'step' if steps_per_epoch is not None else 'micro-batch on every rank'} needs "
                f"train.batch_size={batch_size} x world size {world_size}"
                f"{f' x train.grad_accum={grad_accum}' if steps_per_epoch is not None else ''} = {needed}. "
                f"Fix: a smaller train.batch_size or train.grad_accum, fewer ranks (launcher.nproc_per_node), "
                "more data, or data.tail=pad."
            ),
        )
    ]


def check_repeated_steps(
    micro_batches_per_rank: int | None, *, repeats: int, key: str, grad_accum: int, stream: bool
) -> list[Problem]:
    """A recipe that trains several steps on each step's micro-batches (plan.step_repeats) needs the batch plan
    to hand them again: cached data (a stream is read once per pass), in whole steps (a partial last step repeated
    would shift every later step's micro-batches). `micro_batches_per_rank`: one epoch's, before repeating."""
    if repeats == 1:
        return []
    if stream:
        return [
            Problem(
                check="plan",
                key="data.mode",
                message=(
                    f"{key}={repeats} trains {repeats} steps on each step's micro-batches, which a stream "
                    f"(data.mode=stream) cannot hand again. Fix: data.mode=cached, or {key}=1."
                ),
            )
        ]
    if micro_batches_per_rank is None or micro_batches_per_rank % grad_accum == 0:
        return []
    return [
        Problem(
            check="plan",
            key="train.grad_accum",
            message=(
                f"{key}={repeats} repeats each optimizer step's micro-batches, but the train split's "
                f"{micro_batches_per_rank} micro-batches per rank per epoch are not a whole number of steps of "
                f"train.grad_accum={grad_accum}. Fix: train.grad_accum dividing {micro_batches_per_rank}, "
                f"or {key}=1."
            ),
        )
    ]


# --- 8. LoRA and backends -----------------------------------------------------------------------------------


def check_lora_targets(
    *, targets: Sequence[str], module_names: Sequence[str], defaults: Sequence[str]
) -> list[Problem]:
    """Every LoRA target (lora.target_modules, or the family's defaults) must match a module peft can wrap
    (peft's rule: the full name or a dotted suffix). No targets = full fine-tuning: nothing to check."""
    missing = unmatched_targets(targets, module_names)
    if not missing:
        return []
    valid = sorted({name.rsplit(".", 1)[-1] for name in module_names})
    return [
        Problem(
            check="lora",
            key="lora.target_modules",
            message=(
                f"lora.target_modules {missing} match no module of the model. Valid names: {', '.join(valid)}. "
                f"Fix: lora.target_modules=null (the family's defaults: {list(defaults)}), or names from that "
                "list."
            ),
        )
    ]


def check_backend(
    *,
    load_in_4bit: bool,
    device: str,
    cuda_available: bool,
    bitsandbytes_installed: bool,
    attention_problems: Sequence[str],
    kernels_problems: Sequence[str] = (),
    optimizer_problems: Sequence[str] = (),
) -> list[Problem]:
    """QLoRA needs CUDA and bitsandbytes; the kernels' and optimizers' own rules (models.attention
    .attn_backend_problems, models.kernels.kernels_problems, models.optimizers.optimizer_problems) say why
    model.attn_implementation, model.kernels or optim.name cannot run. Refuse them up front, with the fix."""
    problems = []
    if device == "cuda" and not cuda_available:
        problems.append(
            Problem(
                check="backend",
                key="train.device",
                message="train.device=cuda but no CUDA device is available. Fix: train.device=auto.",
            )
        )
    if load_in_4bit and not cuda_available:
        problems.append(
            Problem(
                check="backend",
                key="model.load_in_4bit",
                message="model.load_in_4bit=true (QLoRA) needs a CUDA device; none is available. "
                "Fix: model.load_in_4bit=false, or run on a CUDA GPU.",
            )
        )
    elif load_in_4bit and not bitsandbytes_installed:
        problems.append(
            Problem(
                check="backend",
                key="model.load_in_4bit",
                message="model.load_in_4bit=true (QLoRA) needs bitsandbytes, which is not installed. "
                "Fix: pip install -e '.[cuda]', or model.load_in_4bit=false.",
            )
        )
    problems += [
        Problem(check="backend", key="model.attn_implementation", message=message) for message in attention_problems
    ]
    problems += [Problem(check="backend", key="model.kernels", message=message) for message in kernels_problems]
    problems += [Problem(check="backend", key="optim.name", message=message) for message in optimizer_problems]
    return problems


def check_precision(
    *, family: str, compute_dtype: str, refused_dtypes: Mapping[str, str], loss_scaling: bool, sharded: bool
) -> list[Problem]:
    """A compute dtype the family cannot train in (Gemma 3 in float16), and fp16 loss scaling under FSDP (each
    rank would judge overflow on its own shard and the ranks' steps would diverge)."""
    problems = []
    if compute_dtype in refused_dtypes:
        problems.append(
            Problem(
                check="backend",
                key="train.mixed_precision",
                message=(
                    f"model.family={family} computes in {compute_dtype} here (train.mixed_precision / model.dtype), "
                    f"which it cannot train in: {refused_dtypes[compute_dtype]}. Fix: train.mixed_precision=bf16 "
                    "(on a GPU with bf16) or train.mixed_precision=no with model.dtype=float32."
                ),
            )
        )
    if loss_scaling and sharded:
        problems.append(
            Problem(
                check="backend",
                key="train.mixed_precision",
                message=(
                    "train.mixed_precision=fp16 with train.parallel=fsdp across ranks: the fp16 loss scaler checks "
                    "for overflow per rank, so sharded ranks could skip different steps. Fix: "
                    "train.mixed_precision=bf16, or train.parallel=ddp."
                ),
            )
        )
    return problems


def check_offload(
    *, activation_offload: bool, device_type: str, fsdp_cpu_offload: bool, sharded: bool
) -> list[Problem]:
    """Activation offload moves GPU memory to the host: on the CPU there is none to save. FSDP CPU offload is a
    policy of FSDP's shards: without train.parallel=fsdp across ranks there are none."""
    problems = []
    if activation_offload and device_type != "cuda":
        problems.append(
            Problem(
                check="backend",
                key="model.activation_offload",
                message=f"model.activation_offload=true on {device_type}: it moves the activations the backward "
                "needs from GPU memory to host memory, and these already are in host memory here, so there is no "
                "device memory to save. Fix: model.activation_offload=false, or run on a CUDA GPU.",
            )
        )
    if fsdp_cpu_offload and not sharded:
        problems.append(
            Problem(
                check="backend",
                key="train.fsdp_cpu_offload",
                message="train.fsdp_cpu_offload=true without train.parallel=fsdp across ranks: it keeps FSDP's "
                "parameter shards, gradients and optimizer state in host memory, and this plan shards nothing. "
                "Fix: train.parallel=fsdp with launcher=torchrun launcher.nproc_per_node=2 (or more), or "
                "train.fsdp_cpu_offload=false.",
            )
        )
    return problems


def check_export(*, export_merged: bool, sharded: bool) -> list[Problem]:
    """A merged export needs the whole model on one rank; under FSDP across ranks only the adapter is gathered."""
    if not (export_merged and sharded):
        return []
    return [
        Problem(
            check="backend",
            key="train.export_merged",
            message=(
                "train.export_merged=true with train.parallel=fsdp across ranks: the model is sharded, so only the "
                "gathered adapter/weights are exported. Fix: train.export_merged=false, then merge offline with "
                "peft: PeftModel.from_pretrained(base, RUN_DIR/adapter).merge_and_unload().save_pretrained(DIR)."
            ),
        )
    ]


def check_gguf_export(
    *, export_gguf: str | None, refusal: str | None, lora: bool, sharded: bool, llama_cpp_missing: str | None = None
) -> list[Problem]:
    """train.export_gguf: an architecture (or rope scaling) the GGUF writer knows, and a merged model to write it
    from (LoRA under FSDP across ranks has none). `refusal`: seqtune.models.gguf_facts.gguf_refusal's reason;
    `llama_cpp_missing`: why llama.cpp, which quantizes and proves the k-quants, cannot run here (None: it can, or
    no k-quant is asked for)."""
    if export_gguf is None:
        return []
    if llama_cpp_missing:
        return [
            Problem(
                check="export",
                key="train.export_gguf",
                message=f"train.export_gguf={export_gguf}: the k-quants are llama.cpp's own quantization, and "
                f"{llama_cpp_missing.removesuffix('.')}. Otherwise: train.export_gguf=f16|bf16|q8_0 (seqtune "
                "writes those itself).",
            )
        ]
    if refusal:
        return [
            Problem(
                check="export",
                key="train.export_gguf",
                message=f"train.export_gguf={export_gguf}: {refusal}. Fix: train.export_gguf=null (merged/ "
                "loads with transformers; convert it with llama.cpp's convert_hf_to_gguf.py).",
            )
        ]
    if lora and sharded:
        return [
            Problem(
                check="export",
                key="train.export_gguf",
                message=f"train.export_gguf={export_gguf} with LoRA under train.parallel=fsdp across ranks: "
                "there is no merged model to write. Fix: train.export_gguf=null, then "
                "`python -m seqtune.export RUN_DIR --gguf TYPE` after training.",
            )
        ]
    return []


def check_gguf_adapter(
    *, lora: bool, dora: bool, full: list[str], sharded: bool, resized: bool, llama_cpp_missing: str | None
) -> list[Problem]:
    """train.export_gguf_adapter: a LoRA run whose adapter llama.cpp's adapter format holds (`full`: the modules
    trained in full or as parameters: lora.modules_to_save + lora.target_parameters), and llama.cpp to prove it."""
    fix = "Fix: train.export_gguf_adapter=false"
    reasons = []
    if not lora:
        reasons.append("there is no adapter (lora.enabled=false): a full fine-tune's GGUF is train.export_gguf")
    elif dora:
        reasons.append("llama.cpp's adapters are plain LoRA, not DoRA (lora.use_dora=true)")
    elif set(full) - {"lm_head"}:
        reasons.append(
            "an adapter file holds low-rank pairs (and a full lm_head), not lora.modules_to_save's or lora.target_parameters' other modules"
        )
    elif resized:
        reasons.append(
            "the embedding is resized (model.resize_embeddings=true): the base file cannot hold the new rows"
        )
    elif sharded:
        reasons.append("LoRA under train.parallel=fsdp across ranks has no merged model to prove it against")
    elif llama_cpp_missing:
        reasons.append(f"it is proven in llama.cpp, and {llama_cpp_missing.removesuffix('.')}")
    return [
        Problem(check="export", key="train.export_gguf_adapter", message=f"train.export_gguf_adapter=true: {r}. {fix}.")
        for r in reasons
    ]


def check_eval_prompts(*, requested: int, found: int, max_seq_len: int) -> tuple[list[Problem], list[str]]:
    """train.eval_samples completes validation prompts: refuse when the split has none (problems), say so when it
    has fewer than asked (notes)."""
    if found == 0:
        return [
            Problem(
                check="data",
                key="train.eval_samples",
                message=(
                    f"train.eval_samples={requested}, but no validation sample has a prompt to complete: none has "
                    f"tokens before its first target, within data.max_seq_len={max_seq_len}. Fix: "
                    "train.eval_samples=0, or validation records with prompts (for data.format=tokenized, labels "
                    "of -100 before the completion)."
                ),
            )
        ], []
    if found < requested:
        return [], [
            f"train.eval_samples={requested}: the validation split has {found} sample(s) with a prompt; "
            "samples are generated from those."
        ]
    return [], []


def check_early_stopping(*, early_stop: bool, lora: bool, sharded: bool) -> list[Problem]:
    """Early stopping ends the run on the best eval's weights, read back from best/: a peft adapter cannot be
    loaded into LoRA weights sharded by FSDP."""
    if not (early_stop and lora and sharded):
        return []
    return [
        Problem(
            check="backend",
            key="train.early_stop_patience",
            message=(
                "train.early_stop_patience with LoRA under train.parallel=fsdp across ranks: the run ends on the "
                "best eval's adapter, read back from best/, which seqtune cannot load into sharded LoRA weights. "
                "Fix: train.parallel=ddp (LoRA's trainable weights are small), or train.early_stop_patience=0."
            ),
        )
    ]


def check_reference_model(*, reference: str, sharded: bool, recipe: RecipeSpec) -> list[Problem]:
    """A full fine-tune's reference model is a frozen copy of the starting weights, whole on every rank: under FSDP
    the policy is sharded and the copy would not be (the recipe's spec says when it needs one: plan.reference)."""
    if reference != Reference.copy or not sharded:
        return []
    fixes = []
    if (preset := recipe.preset(lora=True)) is not None:
        fixes.append(
            f"recipe={preset} train.parallel=ddp (LoRA: the reference is the model with its adapters disabled, no "
            "copy, and the trainable weights are small)"
        )
    if recipe.reference_free_fix:
        fixes.append(recipe.reference_free_fix)
    fixes.append("train.parallel=ddp (each rank holds the whole model and its copy)")
    return [
        Problem(
            check="backend",
            key="train.parallel",
            message=(
                f"recipe_name={recipe.name} with lora.enabled=false under train.parallel=fsdp across ranks: its "
                "reference model is a frozen copy of the starting weights, which seqtune does not shard, so it "
                f"would not fit where FSDP is needed. Fix: {'; or '.join(fixes)}."
            ),
        )
    ]


# --- 9. resume: in seqtune.preflight.resume (the run against its checkpoint's settings and plan) ------------


# --- 10. memory ---------------------------------------------------------------------------------------------


def check_host_memory(
    *, host_gib: float, host_memory_gib: float | None, offloading: str, fits: Sequence[str] = ()
) -> list[Problem]:
    """What the plan offloads into host memory (every rank of the node) vs the host's."""
    if host_memory_gib is None or host_gib <= host_memory_gib:
        return []
    fix = (
        "; or ".join(fits)
        if fits
        else "a smaller train.batch_size, model.gradient_checkpointing=true (only each layer's input is offloaded), "
        "more nodes, or preflight.host_memory_gib=GIB for the machine that will run it"
    )
    return [
        Problem(
            check="memory",
            key="preflight.host_memory_gib",
            message=f"{offloading} keeps ~{host_gib:.1f} GiB in host memory (every rank of the node) > host "
            f"memory {host_memory_gib:.1f} GiB (preflight.host_memory_gib, else this machine's available memory). "
            f"Fix: {fix}.",
        )
    ]


def check_memory(
    *, estimate_gib: float, device_memory_gib: float | None, breakdown: str, fits: Sequence[str] = ()
) -> list[Problem]:
    """Worst-case batch memory vs the device's; with no device (CPU) the estimate is only reported. `fits`: the
    settings that would fit, each with its estimate (preflight tries them)."""
    if device_memory_gib is None or estimate_gib <= device_memory_gib:
        return []
    fix = (
        "one of (each with its estimated peak) " + "; or ".join(fits)
        if fits
        else "none of checkpointing, activation offload, a smaller micro-batch, QLoRA, a lean optimizer, FSDP or "
        "its CPU offload fits, alone or up to three together: use train.parallel=fsdp over more GPUs"
    )
    return [
        Problem(
            check="memory",
            key="train.batch_size",
            message=f"estimated peak memory {estimate_gib:.1f} GiB ({breakdown}) > device memory "
            f"{device_memory_gib:.1f} GiB. Fix: {fix}.",
        )
    ]
