"""Preflight's proof that the tokens trained are the text: each checked sample of the token cache, bos and the
appended eos aside, is exactly the tokens of its rendered text tokenized whole (prompt + completion, or the chat
template's rendering), or decodes back to exactly that text.

A boundary tokenized apart breaks this (a SentencePiece tokenizer puts a `▁` word-start piece before every text
it tokenizes, so a completion tokenized alone starts with a space the text does not have). The samples are read
from the cache training reads and the records from the data files, so the proof is about what trains. Bounded: the
first TEXT_PROOF_SAMPLES samples of each split, shared out over its sources (the boundary rule is the same for
every record of a format).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqtune.config.errors import SeqtuneError
from seqtune.config.plan import VisionFacts
from seqtune.data.cache import CACHE_KEY, TokenCache
from seqtune.data.formats import Conversation, PreferencePair, PromptCompletion
from seqtune.data.split import SplitInput, from_meta
from seqtune.data.tokenize import SampleEncoder
from seqtune.data.types import Reject
from seqtune.files import write_atomic
from seqtune.preflight.observe import Finding

# Samples checked per split: a few seconds at most, and a systematic boundary error shows in the first ones.
TEXT_PROOF_SAMPLES = 512
# Tokens shown on each side of the first difference.
CONTEXT_TOKENS = 3
# Bump when the proof's rule changes: a stored proof of the old rule then stops matching.
PROOF_VERSION = 2  # 2: records with images are parsed as the image-text run parses them, and skipped
PROOF_FILE = f"text-proof-v{PROOF_VERSION}-{TEXT_PROOF_SAMPLES}-{CONTEXT_TOKENS}.json"


@dataclass(kw_only=True)
class TextProof:
    """One split's tokens-vs-text comparison."""

    samples: int  # samples in the split's cache
    checked: int  # samples compared (the first ones, with a rendered text)
    mismatched: Finding  # samples whose tokens are not their text's
    first_difference: str | None = None  # where and how the first mismatched sample differs


def prove_tokens_text(
    split: SplitInput,
    cache: TokenCache,
    tokenizer: Any,
    encoders: Mapping[str, SampleEncoder],
    *,
    media_root: str | None,
    limit: int = TEXT_PROOF_SAMPLES,
) -> TextProof:
    """Compare cached samples of `split` with their records' rendered text (`encoders`: one per format of the
    split's sources, as the scan used): the first `limit` samples, shared out over the split's sources so every
    source (and format) is checked."""
    k = int(cache.meta.get("sequences_per_sample", 1))  # a preference pair: its sequences next to each other
    sources = cache.sample_sources()
    per_source = max(limit // max(len(split.sources), 1), 1)
    wanted: dict[str, int] = {}
    for source in range(len(split.sources)):
        for i in np.flatnonzero((sources == source) & (np.arange(len(sources)) % k == 0))[:per_source]:
            wanted[cache.location(int(i))] = int(i)
    proof = TextProof(samples=len(cache) // k, checked=0, mismatched=Finding())
    encoder = next(iter(encoders.values()))  # one tokenizer: the same bos and eos for every format
    for location, texts in _rendered_texts(split, encoders, media_root, wanted):
        proof.checked += 1
        for j, text in enumerate(texts):
            sample = cache[wanted[location] + j]
            difference = _difference(
                np.asarray(sample.input_ids, np.int64), text, tokenizer, bos_id=encoder.bos_id, eos_id=encoder.eos_id
            )
            if difference is not None:
                proof.mismatched.add(1, [location])
                if proof.first_difference is None:
                    proof.first_difference = f"{location}: {difference}"
                break
    return proof


def _rendered_texts(
    split: SplitInput, encoders: Mapping[str, SampleEncoder], media_root: str | None, wanted: dict[str, int]
) -> Iterator[tuple[str, list[str]]]:
    """(location, rendered text of each of its sequences) of the records whose samples are `wanted`, in the split's
    order."""
    left, parser = len(wanted), None
    for record in _records_of_wanted(split, wanted):
        if not left:
            return
        encoder = encoders[split.sources[record.source].format]
        if parser is None or parser.file != str(record.path) or parser.fmt != encoder.fmt:
            parser = encoder.line_parser(
                str(record.path), media_root=media_root, columns=split.sources[record.source].columns
            )
        location = f"{record.path}:{record.number}"
        if location not in wanted:
            continue
        parsed = parser.parse(record.number, record.payload)
        left -= 1
        texts = rendered_texts(encoder, parsed)
        if texts is not None:
            yield location, texts


def _records_of_wanted(split: SplitInput, wanted: dict[str, int]) -> Iterator[Any]:
    """Each source's records until its wanted samples are passed (a big first source is not read to its end)."""
    for source in range(len(split.sources)):
        left = sum(1 for location in wanted if _source_of(split, location) == source)
        for record in split.records(source=source):
            if not left:
                break
            if f"{record.path}:{record.number}" in wanted:
                left -= 1
            yield record


def _source_of(split: SplitInput, location: str) -> int:
    path = location.rsplit(":", 1)[0]
    return next((i for i, s in enumerate(split.sources) if any(str(f) == path for f in s.files)), -1)


def rendered_texts(encoder: SampleEncoder, record: Any) -> list[str] | None:
    """The text each sequence of a record trains on (a preference pair: chosen, then rejected); None for rejects and
    pre-tokenized records, which have none."""
    if isinstance(record, PreferencePair):
        texts = [rendered_text(encoder, record.chosen), rendered_text(encoder, record.rejected)]
        return None if None in texts else texts  # type: ignore[return-value]
    text = rendered_text(encoder, record)
    return None if text is None else [text]


def rendered_text(encoder: SampleEncoder, record: Any) -> str | None:
    """The text a record trains on as one string (None for pre-tokenized records and records with images, which
    have none)."""
    if isinstance(record, Reject):
        return None
    if isinstance(record, (Conversation, PromptCompletion)) and record.images:
        return None  # an image is a run of the processor's tokens, no text: the vision checks count those runs
    if isinstance(record, Conversation):
        return encoder.tokenizer.apply_chat_template(record.messages, tools=record.tools, tokenize=False)
    if isinstance(record, PromptCompletion):
        return record.completion if encoder.format.prompt_free else record.prompt + record.completion
    return None


def _difference(ids: np.ndarray, text: str, tokenizer: Any, *, bos_id: int | None, eos_id: int) -> str | None:
    """None when `ids` (the sample) is `text`'s tokens, bos and the appended final eos aside, or decodes back to
    `text` exactly; else the first differing token, shown as tokens."""
    whole = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], np.int64)
    core = ids
    if bos_id is not None and len(core) and core[0] == bos_id and not (len(whole) and whole[0] == bos_id):
        core = core[1:]
    if len(core) and core[-1] == eos_id and not (len(whole) and whole[-1] == eos_id):
        core = core[:-1]
    if np.array_equal(core, whole):
        return None
    if tokenizer.decode(core.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False) == text:
        return None
    common = min(len(core), len(whole))
    differ = np.flatnonzero(core[:common] != whole[:common])
    at = int(differ[0]) if len(differ) else common
    lo = max(at - CONTEXT_TOKENS, 0)
    trained = tokenizer.convert_ids_to_tokens(core[lo : at + CONTEXT_TOKENS].tolist())
    expected = tokenizer.convert_ids_to_tokens(whole[lo : at + CONTEXT_TOKENS].tolist())
    return (
        f"from token {at} the sample has {trained[at - lo :]} where the text tokenized whole has "
        f"{expected[at - lo :]} (after {trained[: at - lo]})"
    )


def stored_text_proof(
    cache_dir: Path,
    load_tokenizer: Callable[[], Any],
    *,
    train_on_prompt: bool,
    media_root: str | None,
    vision: VisionFacts | None = None,
) -> TextProof:
    """split_text_proof, kept beside the split's token cache: the proof depends only on what the cache's key
    covers (the data files, the tokenizer, train_on_prompt, media_root) and on this module's rule (its version
    and bound, in the file's name), so a cached re-run reads it back without loading the tokenizer. A stored proof
    that does not parse is computed and written again."""
    stored = Path(cache_dir) / PROOF_FILE
    try:
        body = json.loads(stored.read_text(encoding="utf-8"))
        return TextProof(
            samples=int(body["samples"]),
            checked=int(body["checked"]),
            mismatched=Finding(**body["mismatched"]),
            first_difference=body["first_difference"],
        )
    except (OSError, ValueError, KeyError, TypeError):
        pass
    proof = split_text_proof(
        cache_dir, load_tokenizer(), train_on_prompt=train_on_prompt, media_root=media_root, vision=vision
    )
    try:  # best effort: an unwritable cache only costs the next run this proof again
        write_atomic(stored, json.dumps(asdict(proof)), key=CACHE_KEY)
    except SeqtuneError:
        pass
    return proof


def split_text_proof(
    cache_dir: Path, tokenizer: Any, *, train_on_prompt: bool, media_root: str | None, vision: VisionFacts | None = None
) -> TextProof:
    """The proof for one scanned split, read from its token cache (which records the split it was written from).
    `vision`: an image-text run's facts, so records are parsed as the scan parsed them (input_output's <img> an
    image, not text)."""
    cache = TokenCache.open(cache_dir)
    split = from_meta("split", cache.meta)
    encoders = {
        str(fmt): SampleEncoder(tokenizer, fmt, train_on_prompt=train_on_prompt, vision=vision) for fmt in split.formats
    }
    return prove_tokens_text(split, cache, tokenizer, encoders, media_root=media_root)
