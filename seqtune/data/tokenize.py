"""Records → token ids + target masks, in batches (the speed-critical path of preflight's scan).

Rules every format obeys (the contract in types.py):
- bos appears exactly once at the start when the tokenizer uses one (detected by probing the tokenizer), never
  twice when a chat template already renders it; bos itself is never a target (nothing predicts position 0).
- every sample trains an eos (the model must learn to stop), even if pad == eos: one is appended as the last
  token unless a chat template already closes the last reply with eos (Mistral, Zephyr), whose rendering is then
  kept exactly. Targets are a mask decided here, never derived later by comparing ids with pad/eos.
- prompt tokens are not targets unless train_on_prompt; chat: only assistant turns (with their end-of-turn marker).
- chat: the ids are exactly the chat template's (`apply_chat_template`), plus that eos.
- prompt/completion: the rendered text (prompt + completion) is tokenized whole, as generation sees it, and the
  boundary found by character offsets (as chat does): the ids are exactly the whole text's, whatever the tokenizer's
  prefix-space rule.
Texts are tokenized in ONE batched fast-tokenizer call (Rust, all cores), and samples are assembled with numpy index
arithmetic, so the per-record Python cost is a few list operations.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from seqtune.config.errors import ConfigError
from seqtune.config.plan import Tokens, VisionFacts
from seqtune.data.formats import (
    CHAT_ROLES,
    Conversation,
    LineParser,
    PreTokenized,
    PromptCompletion,
    PromptOnly,
    Record,
    record_format,
    role_reason,
)
from seqtune.data.images import ImageRefused, image_dimensions, stored_image
from seqtune.data.kinds import kind_of_format
from seqtune.data.types import IGNORE_INDEX, TEMPLATE_REJECTED, Reject, Sample, TokenizedSample
from seqtune.tokenizers import templates
from seqtune.tokenizers.facts import added_bos_id


def record_text(prompt: Any, columns: dict[str, Any]) -> str:
    """A prompt record as written, as one canonical JSON text (sorted keys: equal records give equal texts)."""
    return json.dumps({"prompt": prompt, **columns}, sort_keys=True, ensure_ascii=False, default=str)


def record_digest(text: str, images: Sequence[str] = ()) -> int:
    """A signed 64-bit digest of a record's text and its images (stored references): the cache field that finds it
    and tells records apart. The text holds each image as its placeholder only, so two prompts of one text with
    other images are told apart by their images (else the online stage would find the first one's images)."""
    data = json.dumps([text, list(images)], ensure_ascii=False) if images else text
    return int.from_bytes(hashlib.sha256(data.encode("utf-8")).digest()[:8], "little", signed=True)


@dataclass(kw_only=True)
class EncodedBatch:
    """Samples of one batch laid out flat: sample i is ids[offsets[i]:offsets[i+1]] (what the cache stores)."""

    ids: np.ndarray  # int64, all samples concatenated
    target: np.ndarray  # bool, same length: True where the token is a training target
    lengths: np.ndarray  # int64 per sample
    files: list[str]  # per sample
    lines: np.ndarray  # int64 per sample, 1-based
    padding_stripped: np.ndarray  # int64 per sample: pad positions removed from a pre-tokenized row
    source_index: np.ndarray  # int64 per sample: index into the records given to encode_records
    rejects: list[tuple[int, Reject]] = field(default_factory=list)  # (record index, reject) found while encoding
    # Sequences per record: the sample kind's members (2 for preference pairs: chosen, rejected next to each other;
    # every per-sample array above is then per sequence, both sequences of a record with the same source_index).
    sequences_per_sample: int = 1
    # The kind's extra per-sample values (seqtune.data.kinds.SampleField), one entry per sequence like `lines`
    # (every sequence of a sample holds the sample's value).
    fields: dict[str, np.ndarray] = field(default_factory=dict)
    # The members that are the record's own content (what data.duplicates compares, with the fields): empty = all.
    # A KTO sample's KL pair borrows another record's completion, so two copies of a record differ there.
    identity: tuple[int, ...] = ()
    # An image-text run: each sample's images (stored references, seqtune.data.formats.Conversation.images), in the
    # order of their token runs; empty = no sample of the batch has any.
    images: list[tuple[str, ...]] = field(default_factory=list)
    # A kind that keeps its records' columns (SampleKind.keeps_columns): each sample's record as written, one JSON
    # text per sequence (columns.jsonl in the cache).
    columns: list[str] = field(default_factory=list)

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.lengths)])

    def sample(self, i: int, offsets: np.ndarray | None = None) -> TokenizedSample:
        offsets = self.offsets if offsets is None else offsets
        ids = self.ids[offsets[i] : offsets[i + 1]]
        labels = np.where(self.target[offsets[i] : offsets[i + 1]], ids, IGNORE_INDEX)
        return TokenizedSample(
            input_ids=ids,
            labels=labels,
            location=f"{self.files[i]}:{int(self.lines[i])}",
            fields={name: int(values[i]) for name, values in self.fields.items()},
            images=self.images[i] if self.images else (),
        )


def _ragged_positions(lengths: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Destination index of every element of a flat ragged array whose rows go to starts[i], starts[i]+1, ..."""
    row_starts = np.cumsum(lengths) - lengths
    return np.repeat(starts - row_starts, lengths) + np.arange(int(lengths.sum()))


def _image_ids(tokenizer: Any, vision: VisionFacts | None) -> np.ndarray:
    """The ids of an image-text run's image tokens as the loaded tokenizer encodes them: the ones its tokenizer.json
    gave preflight, or the run is refused (added tokens in between would shift them)."""
    if vision is None:
        return np.empty(0, np.int64)
    ids = image_token_ids(tokenizer, vision)
    if vision.image_ids and tuple(ids.tolist()) != vision.image_ids:
        raise ConfigError(
            f"the loaded tokenizer encodes the image tokens {vision.image_tokens} as {ids.tolist()}, "
            f"its tokenizer.json as {list(vision.image_ids)}.",
            key="tokenizer",
            fix="use the tokenizer directory as it is (no added tokens in between).",
        )
    return ids


class SampleEncoder:
    """Encodes records of one format with one tokenizer. `encode_batch` for samples, `encode_records` for speed."""

    def __init__(
        self,
        tokenizer,
        fmt: str,
        *,
        train_on_prompt: bool,
        tokens: Tokens | None = None,
        train_on_reasoning: bool = True,
        vision: VisionFacts | None = None,
    ) -> None:
        """`tokens`: the plan's token facts (the bos the run adds); without them (tools, tests) the same rule is
        asked of the tokenizer (seqtune.tokenizers.facts.added_bos_id). `train_on_reasoning=False`: the chat
        template's reasoning blocks are not targets (data.train_on_reasoning)."""
        if tokenizer.eos_token_id is None:
            raise ConfigError(
                "the tokenizer has no eos token, so samples cannot end with one.",
                key="tokenizer",
                fix="use a tokenizer with an eos token (tokenizer.source=bundled has </s>).",
            )
        self.tokenizer = tokenizer
        self.fmt = fmt
        # What the format declares (seqtune/data/formats/<name>.py): rendered by the template, prompt-free, ...
        self.format = record_format(fmt)
        # The sample kind whose records this format holds: it says how a record is encoded (seqtune.data.kinds).
        self.kind = kind_of_format(fmt)
        # A conversations format's records (chat, sharegpt) are rendered by the chat template; a record of several members
        # (a preference pair) is several records, conversations (rendered by the template, when the tokenizer has
        # one) or prompt/completion.
        self.chat = self.format.conversations
        self.members = self.kind.sequences > 1
        renders = self.chat or (
            (self.members or self.kind.message_prompts) and bool(getattr(tokenizer, "chat_template", None))
        )
        self.train_on_prompt = train_on_prompt
        self.eos_id = int(tokenizer.eos_token_id)
        self.bos_id = tokens.bos_id if tokens is not None else added_bos_id(tokenizer)
        self.vocab_size = len(tokenizer)
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        if self._backend is not None:
            # Whole texts are encoded: data.overlength decides lengths and the collators pad. A truncation or padding
            # preset in tokenizer.json (preflight reports it) must not cut or pad what is measured and trained on;
            # transformers clears both on each of its own calls, the Rust backend called here does not.
            self._backend.no_truncation()
            self._backend.no_padding()
        self.sequences_per_sample = self.kind.sequences
        if self._backend is None and renders:
            raise ConfigError(
                f"data.format={fmt} needs a fast (Rust) tokenizer for character offsets.",
                key="data.format",
                fix="load the tokenizer with use_fast=True.",
            )
        if self.chat and not getattr(tokenizer, "chat_template", None):
            raise ConfigError(
                f"data.format={fmt} but the tokenizer has no chat template (and the model family gives none).",
                key="tokenizer.chat_template",
                fix=f"tokenizer.chat_template=NAME (one of {', '.join(templates.NAMED)}), a .jinja "
                "file or a Jinja string.",
            )
        # The roles this run's chat template takes, asked of the template itself (the parser is told, so a line
        # is never accepted by one and refused by the other); a template that cannot render at all fails here.
        self.chat_roles = chat_template_roles(tokenizer) if renders else CHAT_ROLES
        # Tool definitions (a record's `tools`) need a template that renders them, else a reject names the template.
        self.renders_tools = renders and templates.renders_tool_definitions(tokenizer.chat_template)
        # The template's reasoning block (<think>...</think> at the start of a reply): the parser hands it to the
        # template as reasoning_content, and data.train_on_reasoning=false masks it from the targets.
        self.reasoning = templates.reasoning_block(tokenizer) if renders else None
        self.train_on_reasoning = train_on_reasoning
        if not train_on_reasoning and (self.reasoning is None or not self.reasoning.rendered):
            raise ConfigError(
                f"data.train_on_reasoning=false but data.format={fmt} with this chat template renders no reasoning "
                "block to mask" + (" (the template drops it)." if self.reasoning is not None else "."),
                key="data.train_on_reasoning",
                fix="data.train_on_reasoning=true (the default), or a template that renders reasoning "
                "(tokenizer.chat_template=qwen3) with chat or message-list preference data.",
            )
        # An image-text run (plan.vision): image parts become the placeholder the template renders, which the
        # processor's expansion replaces with the image's token run; those tokens are never targets.
        self.vision = vision
        self.image_ids = _image_ids(tokenizer, vision)
        self.texts_tokenized = 0  # counts tokenizer inputs: lets tests prove a cached re-run tokenizes nothing

    def line_parser(self, file: str, *, media_root: str | None, columns: dict[str, str] | None = None) -> LineParser:
        """The parser for the records of `file` that this encoder's records come from (its ids, vocab and roles);
        `columns`: the data's field names (data.columns)."""
        return LineParser(
            fmt=self.fmt,
            file=file,
            media_root=media_root,
            pad_id=self.tokenizer.pad_token_id,
            eos_id=self.eos_id,
            vocab_size=self.vocab_size,
            roles=self.chat_roles,
            columns=dict(columns or {}),
            reasoning=self.reasoning,
            image_placeholder=self.kind.image_placeholder(self.vision),
        )

    def _token_lists(self, texts: list[str]) -> list[list[int]]:
        self.texts_tokenized += len(texts)
        if self._backend is not None:
            return [e.ids for e in self._backend.encode_batch_fast(texts, add_special_tokens=False)]
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def encode_batch(self, records: list[Record]) -> list[Sample | Reject]:
        """One sample (a TokenizedSample, or a pair's tuple of them) or Reject per record, in order."""
        batch = self.encode_records(records)
        out: list[Sample | Reject | None] = [None] * len(records)
        offsets, k = batch.offsets, batch.sequences_per_sample
        for i in range(0, len(batch.source_index), k):
            sequences = tuple(batch.sample(i + j, offsets) for j in range(k))
            out[int(batch.source_index[i])] = sequences if k > 1 else sequences[0]
        for source, reject in batch.rejects:
            out[source] = reject
        return out  # type: ignore[return-value]

    def encode_records(self, records: list[Record]) -> EncodedBatch:
        """The records of one chunk (one format), encoded as their sample kind says."""
        return self.kind.encode(self, records)

    def _flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        lists = self._token_lists(texts)
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        flat = np.fromiter(chain.from_iterable(lists), dtype=np.int64, count=int(lengths.sum()))
        return flat, lengths

    def encode_prompt_completion(self, records: list[PromptCompletion]) -> EncodedBatch:
        n = len(records)
        ids, is_completion, counts = (self._tokens_whole if self._backend is not None else self._tokens_apart)(records)
        # A text that already ends in the eos token (e.g. a literal "</s>") gets no second one.
        last = np.cumsum(counts) - 1
        ends_on_eos = (
            (counts > 0) & (ids[np.maximum(last, 0)] == self.eos_id) & is_completion[np.maximum(last, 0)]
            if len(ids)
            else np.zeros(n, bool)
        )
        add_eos = ~ends_on_eos
        bos = int(self.bos_id is not None)
        lengths = bos + counts + add_eos
        starts = np.cumsum(lengths) - lengths
        out = np.empty(int(lengths.sum()), np.int64)
        target = np.ones(len(out), bool)
        if self.bos_id is not None:
            out[starts] = self.bos_id
            target[starts] = False
        text_pos = _ragged_positions(counts, starts + bos)
        out[text_pos] = ids
        target[text_pos] = is_completion | self.train_on_prompt
        out[(starts + lengths - 1)[add_eos]] = self.eos_id
        images = [r.images for r in records]
        if any(images):
            target &= ~np.isin(out, self.image_ids)  # an image's tokens are input, never targets
        return EncodedBatch(
            ids=out,
            target=target,
            lengths=lengths,
            files=[r.file for r in records],
            lines=np.fromiter((r.line for r in records), np.int64, count=n),
            padding_stripped=np.zeros(n, np.int64),
            source_index=np.arange(n),
            images=images if any(images) else [],
        )

    def _prompt_text(self, record: PromptCompletion) -> str:
        """The prompt as tokenized: an image-text record's image placeholders expanded into each image's run."""
        if not record.images:
            return record.prompt
        assert self.vision is not None, "only an image-text run's parser keeps images"
        counts = image_token_counts(record.images, self.vision, f"{record.file}:{record.line}")
        return expand_images(record.prompt, [], self.vision, counts)[0]

    def _tokens_whole(self, records: list[PromptCompletion]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each record's rendered text (prompt + completion) tokenized whole in one batched call, as generation will
        see it; a token is the completion's when its last character lies past the prompt. (Tokenizing the two apart
        gives every completion the word-start piece `▁` a SentencePiece tokenizer puts before a text.)
        Returns (flat ids, is_completion per token, tokens per record)."""
        prompts = [""] * len(records) if self.format.prompt_free else [self._prompt_text(r) for r in records]
        texts = [p + r.completion for p, r in zip(prompts, records, strict=True)]
        self.texts_tokenized += len(texts)
        assert self._backend is not None, "offsets need a fast tokenizer (the slow path tokenizes apart)"
        encodings = self._backend.encode_batch(texts, add_special_tokens=False)
        counts = np.fromiter((len(e.ids) for e in encodings), np.int64, count=len(encodings))
        total = int(counts.sum())
        ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), np.int64, count=total)
        ends = np.fromiter((end for e in encodings for _, end in e.offsets), np.int64, count=total)
        prompt_chars = np.repeat(np.fromiter(map(len, prompts), np.int64, count=len(prompts)), counts)
        return ids, (ends > prompt_chars) | (prompt_chars == 0), counts

    def _tokens_apart(self, records: list[PromptCompletion]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A slow (Python) tokenizer gives no character offsets: prompt and completion are tokenized apart (exact
        only without a prefix-space rule; preflight's tokens-vs-text check says when it is not)."""
        n = len(records)
        prompt_ids, p_len = (
            (np.empty(0, np.int64), np.zeros(n, np.int64))
            if self.format.prompt_free
            else self._flat([self._prompt_text(r) for r in records])
        )
        comp_ids, c_len = self._flat([r.completion for r in records])
        counts = p_len + c_len
        starts = np.cumsum(counts) - counts
        ids = np.empty(int(counts.sum()), np.int64)
        is_completion = np.ones(len(ids), bool)
        p_pos = _ragged_positions(p_len, starts)
        ids[p_pos] = prompt_ids
        is_completion[p_pos] = False
        ids[_ragged_positions(c_len, starts + p_len)] = comp_ids
        return ids, is_completion, counts

    def _assemble(
        self,
        parts: list[tuple[np.ndarray, np.ndarray]],
        records: list,
        kept: list[int],
        rejects: list[tuple[int, Reject]],
        stripped: list[int],
    ) -> EncodedBatch:
        """Per-sample (ids, target) → one batch, applying the bos/eos rules. Used by the per-record formats."""
        out_ids, out_target = [], []
        for ids, target in parts:
            if self.bos_id is not None and (len(ids) == 0 or ids[0] != self.bos_id):
                ids, target = np.concatenate([[self.bos_id], ids]), np.concatenate([[False], target])
            elif self.bos_id is not None:
                target = target.copy()
                target[0] = False
            if self._closed_with_eos(ids, target):
                pass  # a chat template ended the last reply with eos, a target already: its rendering stays exact
            elif len(ids) == 0 or ids[-1] != self.eos_id:
                ids, target = np.concatenate([ids, [self.eos_id]]), np.concatenate([target, [True]])
            else:
                target[-1] = True
            if len(self.image_ids):
                target = target & ~np.isin(ids, self.image_ids)  # an image's tokens are input, never targets
            out_ids.append(ids.astype(np.int64))
            out_target.append(target.astype(bool))
        lengths = np.fromiter(map(len, out_ids), np.int64, count=len(out_ids))
        images = [tuple(getattr(records[i], "images", ())) for i in kept]
        return EncodedBatch(
            ids=np.concatenate(out_ids) if out_ids else np.empty(0, np.int64),
            target=np.concatenate(out_target) if out_target else np.empty(0, bool),
            lengths=lengths,
            files=[records[i].file for i in kept],
            lines=np.asarray([records[i].line for i in kept], np.int64),
            padding_stripped=np.asarray(stripped, np.int64),
            source_index=np.asarray(kept, np.int64),
            rejects=rejects,
            images=images if any(images) else [],
        )

    def encode_prompts(self, records: list[PromptOnly]) -> EncodedBatch:
        """data.format=prompt: each prompt as generation starts from it (bos once; messages through the chat
        template with its generation prompt), no eos. Its last token is its one target: an anchor that tells a
        prompt from a filler and counts prompts, never trained (seqtune.data.kinds)."""
        template = getattr(self.tokenizer, "chat_template", None)
        texts, kept, rejects = [], [], []
        for i, record in enumerate(records):
            if isinstance(record.prompt, str):
                texts.append(record.prompt)
            elif not template:
                rejects.append(
                    (
                        i,
                        Reject(
                            file=record.file,
                            line=record.line,
                            reason=TEMPLATE_REJECTED + ": a "
                            "message-list prompt needs a chat template (tokenizer.chat_template)",
                        ),
                    )
                )
                continue
            else:
                text = self.tokenizer.apply_chat_template(record.prompt, tokenize=False, add_generation_prompt=True)
                expanded = self._rendered_images(record, text, []) if record.images else (text, [])
                if isinstance(expanded, Reject):
                    rejects.append((i, expanded))
                    continue
                texts.append(expanded[0])
            kept.append(i)
        written = [record_text(records[i].prompt, records[i].columns) for i in kept]
        lists = self._token_lists(texts)
        ids, target = [], []
        for seq in lists:
            row = np.asarray(seq, np.int64)
            if self.bos_id is not None and (len(row) == 0 or row[0] != self.bos_id):
                row = np.concatenate([[self.bos_id], row]).astype(np.int64)
            mask = np.zeros(len(row), bool)
            mask[-1] = True
            ids.append(row)
            target.append(mask)
        return EncodedBatch(
            ids=np.concatenate(ids) if ids else np.empty(0, np.int64),
            target=np.concatenate(target) if target else np.empty(0, bool),
            lengths=np.fromiter(map(len, ids), np.int64, count=len(ids)),
            files=[records[i].file for i in kept],
            lines=np.asarray([records[i].line for i in kept], np.int64),
            padding_stripped=np.zeros(len(kept), np.int64),
            source_index=np.asarray(kept, np.int64),
            rejects=rejects,
            fields={
                "record": np.asarray(
                    [record_digest(t, records[i].images) for t, i in zip(written, kept, strict=True)], np.int64
                )
            },
            columns=written,
            images=[records[i].images for i in kept] if any(records[i].images for i in kept) else [],
        )

    def _rendered_images(
        self, record: Conversation | PromptOnly, text: str, spans: list[tuple[int, int]]
    ) -> tuple[str, list[tuple[int, int]]] | Reject:
        """A rendered record's image placeholders expanded into each image's token run (its target spans moved), or
        the Reject of a template that did not render one placeholder per image, or of an unusable image."""
        assert self.vision is not None, "only an image-text run's parser keeps images"
        rendered = text.count(self.vision.placeholder)
        if rendered != len(record.images):
            reason = (
                f"{TEMPLATE_REJECTED}: the chat template (tokenizer.chat_template) rendered {rendered} image "
                f"marker(s) {self.vision.placeholder} for the record's {len(record.images)} image(s)"
            )
            return Reject(file=record.file, line=record.line, reason=reason)
        try:
            counts = image_token_counts(record.images, self.vision, f"{record.file}:{record.line}")
        except ImageRefused as unusable:
            return Reject(file=record.file, line=record.line, reason=unusable.reason)
        return expand_images(text, spans, self.vision, counts)

    def _closed_with_eos(self, ids: np.ndarray, target: np.ndarray) -> bool:
        """chat: the last target is an eos (Mistral's and Zephyr's templates end every reply with one)."""
        targets = np.flatnonzero(target)
        return (self.chat or self.members) and len(targets) > 0 and int(ids[targets[-1]]) == self.eos_id

    def encode_members(
        self,
        records: list[Any],
        members: dict[str, list[PromptCompletion | Conversation]],
        fields: dict[str, list[int]] | None = None,
        identity: tuple[str, ...] = (),
    ) -> EncodedBatch:
        """Records of several sequences each (a kind's members, e.g. a pair's chosen and rejected): member m of
        record i is members[m][i], encoded exactly as an SFT record of its shape would be (prompt/completion, or a
        conversation through the chat template), the members of a record laid out next to each other. A record
        whose any member is rejected is rejected whole (the reason names the member). `fields`: the kind's
        per-sample values by field name, one per record; `identity`: the members that are the record's own content
        (empty: all), what data.duplicates compares."""
        sides = [self._encode_side(side_records, name) for name, side_records in members.items()]
        k = len(sides)
        ids, target, lengths, kept, rejects = [], [], [], [], []
        for i, encoded in enumerate(zip(*sides, strict=True)):
            refused = next((s for s in encoded if isinstance(s, Reject)), None)
            if refused is not None:
                rejects.append((i, refused))
                continue
            for seq_ids, seq_target in encoded:
                ids.append(seq_ids)
                target.append(seq_target)
                lengths.append(len(seq_ids))
            kept += [i] * k
        index = np.asarray(kept, np.int64)
        # Each sequence keeps its own member's images (a pair's chosen and rejected each carry the prompt's): the
        # collator gives the model every row's images, as TRL repeats pixel_values for chosen and rejected.
        names = list(members)
        images = [tuple(getattr(members[names[j % k]][i], "images", ())) for j, i in enumerate(kept)]
        return EncodedBatch(
            ids=np.concatenate(ids) if ids else np.empty(0, np.int64),
            target=np.concatenate(target) if target else np.empty(0, bool),
            lengths=np.asarray(lengths, np.int64),
            files=[records[i].file for i in kept],
            lines=np.asarray([records[i].line for i in kept], np.int64),
            padding_stripped=np.zeros(len(kept), np.int64),
            source_index=index,
            rejects=rejects,
            images=images if any(images) else [],
            sequences_per_sample=k,
            fields={name: np.asarray(values, np.int64)[index] for name, values in (fields or {}).items()},
            identity=tuple(list(members).index(name) for name in identity),
        )

    def _encode_side(
        self, records: list[PromptCompletion | Conversation], side: str
    ) -> list[tuple[np.ndarray, np.ndarray] | Reject]:
        """(ids, target) or a Reject per record of one side of the pairs, each by its shape's encoder."""
        out: list[tuple[np.ndarray, np.ndarray] | Reject | None] = [None] * len(records)
        for shape, encode in ((PromptCompletion, self.encode_prompt_completion), (Conversation, self.encode_chat)):
            members = [i for i, r in enumerate(records) if isinstance(r, shape)]
            if not members:
                continue
            # isinstance above proved each member is a `shape`; mypy cannot pair a shape with its encoder.
            batch = encode([records[i] for i in members])  # type: ignore[misc]
            offsets = batch.offsets
            for j, source in enumerate(batch.source_index):
                lo, hi = offsets[j], offsets[j + 1]
                out[members[int(source)]] = (batch.ids[lo:hi], batch.target[lo:hi])
            for source, reject in batch.rejects:
                out[members[source]] = Reject(file=reject.file, line=reject.line, reason=f"{reject.reason} ({side})")
        return out  # type: ignore[return-value]

    def encode_pretokenized(self, records: list[PreTokenized]) -> EncodedBatch:
        parts = []
        for r in records:
            target = np.ones(len(r.input_ids), bool) if r.labels is None else r.labels != IGNORE_INDEX
            parts.append((r.input_ids, target))
        return self._assemble(parts, records, list(range(len(records))), [], [r.padding_stripped for r in records])

    def encode_chat(self, records: list[Conversation]) -> EncodedBatch:
        texts, spans, kept, rejects = [], [], [], []
        for i, record in enumerate(records):
            # Records built elsewhere than this encoder's parser are held to the same roles.
            refused = next((n for n, m in enumerate(record.messages) if m["role"] not in self.chat_roles), None)
            if refused is not None:
                reason = role_reason(f"messages[{refused}]", record.messages[refused]["role"], self.chat_roles)
                rejects.append((i, Reject(file=record.file, line=record.line, reason=reason)))
                continue
            thought = next((n for n, m in enumerate(record.messages) if "reasoning_content" in m), None)
            if thought is not None and self.reasoning is None:
                reason = (
                    f"{TEMPLATE_REJECTED}: messages[{thought}] reasoning_content would not be rendered: the chat "
                    "template (tokenizer.chat_template) has no reasoning block"
                )
                rejects.append((i, Reject(file=record.file, line=record.line, reason=reason)))
                continue
            if record.tools and not self.renders_tools:
                reason = (
                    f"{TEMPLATE_REJECTED}: its {len(record.tools)} tool definition(s) would not be rendered: "
                    "the chat template (tokenizer.chat_template) never reads `tools`"
                )
                rejects.append((i, Reject(file=record.file, line=record.line, reason=reason)))
                continue
            try:
                text, assistant_spans = render_chat(
                    self.tokenizer, record.messages, tools=record.tools, first_target=record.first_target
                )
            except Exception as exc:  # noqa: BLE001 - a template's own error is this record's reject reason
                reason = f"{TEMPLATE_REJECTED}: the chat template (tokenizer.chat_template) refused it: {exc}"
                rejects.append((i, Reject(file=record.file, line=record.line, reason=reason)))
                continue
            if record.images:
                expanded = self._rendered_images(record, text, assistant_spans)
                if isinstance(expanded, Reject):
                    rejects.append((i, expanded))
                    continue
                text, assistant_spans = expanded
            texts.append(text)
            if not self.train_on_reasoning and self.reasoning is not None:
                assistant_spans = _after_reasoning(text, assistant_spans, self.reasoning)
            spans.append(assistant_spans)
            kept.append(i)
        self.texts_tokenized += len(texts)
        assert self._backend is not None, "__init__ refuses a rendering format without a fast tokenizer"
        encodings = self._backend.encode_batch(texts, add_special_tokens=False) if texts else []
        parts = []
        for enc, assistant_spans in zip(encodings, spans, strict=True):
            # A token is a target when its last character lies inside a reply: a token straddling the end
            # (where the partial rendering diverged from the full one) belongs to the next turn.
            ends = np.fromiter((e for _, e in enc.offsets), np.int64, count=len(enc.offsets))
            # data.train_on_prompt: every token of the conversation trains (system and user turns too).
            target = np.full(len(ends), self.train_on_prompt, bool)
            for lo, hi in assistant_spans:
                target |= (ends > lo) & (ends <= hi)
            parts.append((np.asarray(enc.ids, np.int64), target))
        return self._assemble(parts, records, kept, rejects, [0] * len(kept))


def image_token_ids(tokenizer, vision: VisionFacts) -> np.ndarray:
    """The ids of the image run's tokens (boi, image, eoi), each one token of the tokenizer (else ConfigError)."""
    ids = []
    for token in vision.image_tokens:
        encoded = tokenizer.encode(token, add_special_tokens=False)
        if len(encoded) != 1:
            raise ConfigError(
                f"the image token {token!r} is {len(encoded)} tokens for this tokenizer, not one: images cannot be "
                "given to the model.",
                key="tokenizer",
                fix="use the image-text checkpoint's own tokenizer (tokenizer=auto with model.path), or the "
                "tokenizer its tiny model is sized for (model.tiny_tokenizer).",
            )
        ids.append(encoded[0])
    return np.asarray(ids, np.int64)


def image_token_counts(images: tuple[str, ...], vision: VisionFacts, where: str) -> list[int]:
    """Each image's token count (VisionFacts.image_tokens_for): a dynamic-resolution model's from the image's own
    size, read from its header; raises ImageRefused for an image the processor cannot take."""
    if vision.grid is None:
        return [vision.tokens_per_image] * len(images)
    counts = []
    for stored in images:
        ref = stored_image(stored)
        width, height = image_dimensions(ref)
        try:
            counts.append(vision.image_tokens_for(width, height))
        except ValueError as exc:
            raise ImageRefused(
                "bad_image",
                f"{ref.name} ({width}x{height}) cannot be given to {vision.image_processor_class}: {exc}",
                where=where,
                fix="crop or pad the image to an aspect ratio of at most 200:1, or remove the record",
            ) from None
    return counts


def expand_images(
    text: str, spans: list[tuple[int, int]], vision: VisionFacts, counts: list[int]
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text with each image placeholder replaced by the processor's run for that image, `counts[i]`
    image tokens for the i-th (exactly as the processor rewrites the prompt: Gemma3Processor replaces its boi token
    by full_image_sequence, Qwen-VL's repeats <|image_pad|> per image), and the target character spans moved past
    what each replacement added."""
    pieces = text.split(vision.placeholder)
    runs = [vision.expansion_for(n) for n in counts]
    assert len(runs) == len(pieces) - 1, "the caller checked one placeholder per image"
    starts, grows, position = [], [], 0
    for piece, run in zip(pieces[:-1], runs, strict=True):
        position += len(piece)
        starts.append(position)
        grows.append(len(run) - len(vision.placeholder))
        position += len(vision.placeholder)

    def moved(offset: int) -> int:
        return offset + sum(grow for start, grow in zip(starts, grows, strict=True) if start < offset)

    out = pieces[0] + "".join(run + piece for run, piece in zip(runs, pieces[1:], strict=True))
    return out, [(moved(lo), moved(hi)) for lo, hi in spans]


def _after_reasoning(text: str, spans: list[tuple[int, int]], block: templates.ReasoningBlock) -> list[tuple[int, int]]:
    """Each reply span without the reasoning block it opens with (the markers, the reasoning and the whitespace
    after the block): the reply after it stays a target. The parser moved the reasoning out of the content and
    left no marker in it, so the block's first closing marker is its end."""
    out = []
    for lo, hi in spans:
        start = lo + len(text[lo:hi]) - len(text[lo:hi].lstrip())
        close = text.find(block.close, start, hi) if text.startswith(block.open, start) else -1
        if close >= 0:
            end = close + len(block.close)
            lo = end + len(text[end:hi]) - len(text[end:hi].lstrip())
        out.append((lo, hi))
    return out


def render_chat(
    tokenizer, messages: list[dict], tools: list[dict] | None = None, first_target: int = 0
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation (exactly `apply_chat_template`'s text, with `tools` given to the template) and the
    character span of each assistant reply from message `first_target` on (end-of-turn marker included).

    Renders incrementally: the text of messages[:i] with the generation prompt must be a prefix of the text of
    messages[:i+1]; what assistant turn i adds after that prefix is its target span. Works with any template
    that renders conversations append-only (no {% generation %} markers needed).
    """
    full = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or i < first_target:
            continue
        before = (
            tokenizer.apply_chat_template(messages[:i], tools=tools, tokenize=False, add_generation_prompt=True)
            if i
            else ""
        )
        upto = tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False)
        if not (upto.startswith(before) and full.startswith(before)):
            raise ValueError(
                f"its rendering is not append-only at message {i} (the generation prompt is not a "
                "prefix of the reply), so the assistant reply cannot be located"
            )
        # A template may close the LAST turn differently (e.g. eos after the final reply): the reply ends where
        # this partial rendering stops agreeing with the full conversation; trailing whitespace is not the reply's.
        common = os.path.commonprefix([upto, full])
        if len(common.rstrip()) <= len(before):  # e.g. Qwen3's official template drops an earlier turn's <think>
            raise ValueError(
                f"its rendering of assistant message {i} changes once later messages follow (not "
                "append-only), so the reply as trained cannot be located"
            )
        spans.append((len(before), len(common.rstrip())))
    return full, spans


# The exchange every chat template must render; a template that cannot is broken, not the data.
_PLAIN_CHAT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
# One conversation per optional role, with the role where real conversations put it.
_ROLE_PROBES = {
    "system": [{"role": "system", "content": "Be brief."}, *_PLAIN_CHAT],
    "tool": [*_PLAIN_CHAT, {"role": "tool", "content": "{}"}, {"role": "assistant", "content": "Done"}],
}


def chat_template_roles(tokenizer) -> tuple[str, ...]:
    """The roles of CHAT_ROLES that the tokenizer's chat template renders (in CHAT_ROLES order).

    Raises ConfigError naming tokenizer.chat_template when the template cannot render a plain user/assistant
    exchange (a Jinja syntax error, an undefined name, a template that raises or is not append-only): one
    problem about the template, instead of every record of the data rejected for it.
    """
    try:
        render_chat(tokenizer, _PLAIN_CHAT)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the Jinja raises is the template's problem
        raise ConfigError(
            f"the chat template cannot render a plain user/assistant conversation: {type(exc).__name__}: {exc}",
            key="tokenizer.chat_template",
            fix="set tokenizer.chat_template to a template that renders (null = the tokenizer's own, else the model "
            "family's).",
        ) from None
    accepted = {"user", "assistant"}
    for role, messages in _ROLE_PROBES.items():
        # A template that never names the tool role may still render a tool turn without raising (as some generic
        # role), which would train on a format the model never saw: tool turns need a template written for them.
        if role == templates.TOOL_ROLE and not templates.renders_tool_turns(tokenizer.chat_template):
            continue
        try:
            render_chat(tokenizer, messages)
            accepted.add(role)
        except Exception:  # noqa: BLE001 - refusing a role is how a template says it has none
            continue
    return tuple(role for role in CHAT_ROLES if role in accepted)
