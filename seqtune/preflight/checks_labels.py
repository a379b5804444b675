"""Checks on what the labels and the data text actually contain (the second wave of preflight's checks).

Like checks.py: plain values in, a list of Problems out, each naming the key, the values, where in the data
(`file:line`) and the fix. The values come from seqtune.preflight.observe (one pass over the token cache) and
seqtune.preflight.content gathers them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from seqtune.preflight.checks import Problem
from seqtune.preflight.observe import NON_CONTROL, SAMPLE_END, Finding

# How many places a message names before "and N more".
MAX_LISTED = 5


def _first(finding: Finding, total: int | None = None) -> str:
    total = finding.count if total is None else total
    listed = ", ".join(finding.locations[:MAX_LISTED])
    more = total - min(len(finding.locations), MAX_LISTED)
    return f"{listed} and {more} more" if more > 0 else listed


# --- 1. every turn's terminator is a target ---------------------------------------------------------------------


def _label_key(split: str, templated: bool) -> str:
    return "tokenizer.chat_template" if templated else f"data.{split}"


def classify_spans(
    run_ends: Mapping[tuple[int, int], Finding], terminators: Mapping[int, str]
) -> tuple[dict[int, Finding], Finding]:
    """(terminator id -> target spans followed by that terminator outside the targets, spans with no terminator
    at all). run_ends: (class of a span's last token, class of the token after it) -> how many spans, where;
    classes are token ids, NON_CONTROL or SAMPLE_END (seqtune.preflight.observe)."""
    masked: dict[int, Finding] = {}
    unterminated = Finding()
    for (end, nxt), finding in run_ends.items():
        if end in terminators:
            continue
        if nxt in terminators:
            masked.setdefault(nxt, Finding()).add(finding.count, finding.locations)
        else:
            unterminated.add(finding.count, finding.locations)
    return masked, unterminated


def check_turn_terminators(
    *, split: str, templated: bool, run_ends: Mapping[tuple[int, int], Finding], terminators: Mapping[int, str]
) -> list[Problem]:
    """Every span of targets (an assistant turn, a completion) must end on a terminator (the family's end-of-turn,
    the chat template's turn closer, or eos) that is itself a target. A terminator right after a span is one the
    template left outside the targets (axolotl #3754: Gemma's <end_of_turn>); a span followed by no terminator at
    all teaches a reply that never ends. `terminators`: id -> text (plan.tokens.terminators). `templated`: the chat
    template renders the records (plan.tokens.templated: chat, sharegpt, conversational pairs), so it decides where
    a turn ends."""
    masked, unterminated = classify_spans(run_ends, terminators)
    key = _label_key(split, templated)
    fix = (
        "Fix: tokenizer.chat_template=null (the tokenizer's own template, else the model family's), or a "
        "template whose assistant turn renders its end-of-turn token inside the reply."
        if templated
        else f"Fix: make the labels of data.{split} include the end-of-turn token of each "
        "target span (labels = input_ids there)."
    )
    problems = []
    for token_id, found in sorted(masked.items()):
        problems.append(
            Problem(
                check="terminator",
                key=key,
                location=found.locations[0],
                message=(
                    f"{found.count} target span(s) of data.{split} are followed by their terminator "
                    f"{terminators[token_id]} (id {token_id}) outside the targets: the model never learns to "
                    f"end a reply, so generation runs on. First: {_first(found)}. {fix}"
                ),
            )
        )
    if unterminated.count:
        expected = " or ".join(f"{terminators[i]} (id {i})" for i in sorted(terminators))
        problems.append(
            Problem(
                check="terminator",
                key=key,
                location=unterminated.locations[0],
                message=(
                    f"{unterminated.count} target span(s) of data.{split} end without an end-of-turn token: "
                    f"neither their last target nor the token after it is {expected}, so the model never learns "
                    f"to end those replies. First: {_first(unterminated)}. {fix}"
                ),
            )
        )
    return problems


def trained_terminators(control_targets: Mapping[int, int], terminators: Mapping[int, str]) -> dict[int, int]:
    """Terminator id -> how many times it is a target (a token the model learns to emit): the report's and the
    exports' "trained terminators". `control_targets`: control token id -> target count (preflight.observe)."""
    return {t: n for t, n in sorted(control_targets.items()) if t in terminators}


# --- 4. control tokens written in data text, and doubled bos ----------------------------------------------------


def check_literal_controls(*, split: str, per_token: Mapping[str, Finding], lines: Finding) -> list[Problem]:
    """Data text holding a control token's string (`<|eot_id|>`, `<s>`) is encoded as that control token: an eos
    or end-of-turn in the middle of a prompt or reply."""
    if not lines.count:
        return []
    tokens = ", ".join(
        f"{text} in {finding.count} line(s)"
        for text, finding in sorted(per_token.items(), key=lambda item: -item[1].count)
    )
    return [
        Problem(
            check="specials",
            key=f"data.{split}",
            location=lines.locations[0],
            message=(
                f"{lines.count} line(s) of data.{split} hold special-token strings in their text, which the "
                f"tokenizer turns into control tokens, not text ({tokens}): {_first(lines)}. Fix: remove or "
                "rewrite those strings in the data (seqtune adds bos, eos and the chat template's markers itself)."
            ),
        )
    ]


def check_double_bos(*, split: str, double_bos: Finding, bos: str) -> list[Problem]:
    """Pre-tokenized rows that already start with two bos (tokenized twice with add_special_tokens)."""
    if not double_bos.count:
        return []
    return [
        Problem(
            check="specials",
            key=f"data.{split}",
            location=double_bos.locations[0],
            message=(
                f"{double_bos.count} pre-tokenized row(s) of data.{split} start with two bos tokens ({bos} {bos}): "
                f"{_first(double_bos)}. Fix: re-tokenize data.{split} without adding bos twice (bos once, or "
                "add_special_tokens=False when a chat template renders it)."
            ),
        )
    ]


# --- 6. truncation that cuts the final terminator ----------------------------------------------------------------


def check_terminator_cut(*, split: str, policy: str, prompt_free: bool, cut: Finding) -> list[Problem]:
    """data.overlength=truncate keeps a long sample's head: its final eos / end-of-turn goes, and the model learns
    that long replies never end (LLaMA-Factory #5231). A split of prompt-free formats only (plain text) is continued
    pretraining, where a cut document end is expected; every other split is refused."""
    if not cut.count or prompt_free:
        return []
    if policy == "truncate_prompt":
        fix = (
            "their completion alone is longer than data.max_seq_len. Fix: data.overlength=drop, or a larger "
            "data.max_seq_len"
        )
    else:
        fix = (
            "Fix: data.overlength=truncate_prompt (keeps the completion, cuts the prompt from the left), "
            "data.overlength=drop, or a larger data.max_seq_len"
        )
    return [
        Problem(
            check="truncation",
            key="data.overlength",
            location=cut.locations[0],
            message=(
                f"data.overlength={policy} cuts the final eos / end-of-turn of {cut.count} data.{split} "
                f"sample(s), so the model learns not to stop: {_first(cut)}; {fix}."
            ),
        )
    ]


# --- 8. exact duplicates ----------------------------------------------------------------------------------------


def duplicate_copies(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(copies, originals): indices of samples equal to an earlier sample of the same split, and that sample."""
    if not len(hashes):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    original = first[inverse.ravel()]
    copies = np.flatnonzero(original != np.arange(len(hashes)))
    return copies, original[copies]


def found_in(hashes: np.ndarray, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indices of `hashes` also in `reference`, the matching index in `reference`)."""
    if not len(hashes) or not len(reference):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    order = np.argsort(reference, kind="stable")
    sorted_ref = reference[order]
    slot = np.minimum(np.searchsorted(sorted_ref, hashes), len(sorted_ref) - 1)
    hits = np.flatnonzero(sorted_ref[slot] == hashes)
    return hits, order[slot[hits]]


def check_duplicates(
    *, split: str, samples: int, copies: int, examples: Sequence[str], of: str | None, policy: str
) -> list[Problem]:
    """Exact duplicate samples (same tokens, same targets): within a split (`of` None) or of the train split (`of`
    = "train", for val/test: evaluation on what was trained). data.duplicates=refuse fails on any; so does drop on
    copies of train (drop leaves out copies within a split, found by the scan, so none reach this check); keep
    accepts them (duplicate_notes says so). `examples`: "copy (= original)" locations."""
    if not copies or not samples or policy == "keep" or (policy == "drop" and not of):
        return []
    what = f"are exact duplicates of data.{of} samples" if of else "are exact duplicates of another sample"
    listed = ", ".join(examples[:MAX_LISTED]) + (f" and {copies - MAX_LISTED} more" if copies > MAX_LISTED else "")
    if of:
        fix = (
            f"remove them from data.{split} (evaluating on trained samples measures recall), or "
            f"data.duplicates=keep to evaluate on them anyway"
        )
    else:
        fix = "data.duplicates=drop (the default: train one copy of each), or data.duplicates=keep to train every copy"
    return [
        Problem(
            check="duplicates",
            key="data.duplicates",
            location=examples[0].split(" ", 1)[0] if examples else None,
            message=(
                f"{copies} of {samples} data.{split} samples ({copies / samples:.2%}) {what} (same tokens and "
                f"targets; data.duplicates={policy}): {listed}. Fix: {fix}."
            ),
        )
    ]


def duplicate_notes(*, split: str, samples: int, copies: int, of: str | None, policy: str) -> list[str]:
    """Duplicates data.duplicates=keep trains (or evaluates on) are said."""
    if not copies or not samples or policy != "keep":
        return []
    what = f"exact duplicates of data.{of} samples" if of else "exact duplicates of another sample"
    return [
        f"{copies} of {samples} data.{split} samples ({copies / samples:.1%}) are {what}, kept (data.duplicates=keep)."
    ]


def dropped_duplicates_note(*, split: str, records: int, dropped: int, first: str | None) -> list[str]:
    """data.duplicates=drop: how many records of the split the scan left out, and the first."""
    if not dropped:
        return []
    return [
        f"data.duplicates=drop: {dropped} of {records} data.{split} records are exact duplicates (same tokens and "
        f"targets) of an earlier record and are left out{f' (first: {first})' if first else ''}; each is in rejects.jsonl "
        "naming the copy it repeats. To train every copy: data.duplicates=keep."
    ]


def stream_copies_note(past_sample: int) -> list[str]:
    """data.duplicates=drop in stream mode: the copies found past data.preflight_sample (as written)."""
    if not past_sample:
        return []
    return [
        f"data.duplicates=drop: {past_sample} data.train records past data.preflight_sample repeat an earlier record "
        "exactly as written and are left out of every stream pass; each is in rejects.jsonl naming the record it "
        "repeats."
    ]


def describe_classes(run_ends: Mapping[tuple[int, int], Finding], names: Mapping[int, str]) -> dict[str, int]:
    """Readable (last token -> next token) counts of the target spans, for preflight.json."""

    def label(token: int) -> str:
        return {NON_CONTROL: "text", SAMPLE_END: "end"}.get(token, names.get(token, str(token)))

    return {f"{label(end)} -> {label(nxt)}": finding.count for (end, nxt), finding in run_ends.items()}


# --- 9. the tokens are the text -----------------------------------------------------------------------------------


def check_tokens_text(
    *, split: str, checked: int, samples: int, mismatched: Finding, first_difference: str | None, tokenizer_key: str
) -> list[Problem]:
    """Every checked sample's ids (bos and the appended eos aside) must be its rendered text tokenized whole, or
    decode back to exactly that text: a prompt/completion boundary tokenized apart trains tokens generation never
    sees (a SentencePiece `▁` before every completion). seqtune finds the boundary by character offsets, which a
    fast tokenizer (tokenizer.json) gives; a tokenizer whose boundary cannot be made exact is refused."""
    if not mismatched.count:
        return []
    return [
        Problem(
            check="tokens",
            key=tokenizer_key,
            location=mismatched.locations[0],
            message=(
                f"{mismatched.count} of {checked} checked data.{split} samples (of {samples}: the first of each "
                "source) "
                f"are not the tokens of their text: the prompt/completion or turn boundary is tokenized apart "
                f"from the text, so training sees tokens that generation never will. {first_difference}. "
                f"First: {_first(mismatched)}. Fix: a fast tokenizer ({tokenizer_key} naming a directory with a "
                "tokenizer.json, which gives the character offsets the boundary is found by), or data.format=text "
                "with each record's whole text."
            ),
        )
    ]


def tokens_text_note(*, split: str, checked: int, samples: int) -> list[str]:
    """The proof that passed, counted (the check reads only the first samples of a big split, and says so)."""
    if not checked:
        return []
    scope = f"all {samples}" if checked == samples else f"{checked} of {samples} (the first of each source)"
    return [f"tokens = text: {scope} data.{split} samples are exactly the tokens of their rendered text."]
