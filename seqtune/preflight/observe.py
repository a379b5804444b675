"""What the content checks need from a scanned split: one numpy pass over its token cache and one byte scan of its
data files, kept beside the cache so a cached re-run reads one small JSON file and one array.

Nothing stored here depends on the model family, max_seq_len or a threshold (the checks apply those): only on the
cache's content and the tokenizer, which are both in the cache's key. Per split it records
- target runs: for every maximal run of target tokens (an assistant turn; a completion), the class of its last
  token (whitespace after it skipped: a template's newline after its turn closer) and of the token after the run
  (a control token's id, NON_CONTROL, or SAMPLE_END), counted, first few located;
- control tokens used as inputs and as targets, counted by id;
- pre-tokenized rows that start with two bos;
- lines whose text holds a control token's string (a literal `<|eot_id|>` becomes that control id), except the
  chat template's reasoning markers where the template reads them (a reply that opens with <think>...</think>);
- a 64-bit hash of every sample's tokens and targets (sample_hash.bin), for exact duplicates.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from seqtune.data.cache import TokenCache
from seqtune.data.formats import LineParser, record_texts
from seqtune.data.split import SplitInput, from_meta
from seqtune.data.types import Reject
from seqtune.tokenizers.templates import ReasoningBlock

VERSION = 2
OBSERVATIONS_FILE = f"observations-v{VERSION}.json"
HASH_FILE = f"sample_hash-v{VERSION}.bin"
NON_CONTROL = -1
SAMPLE_END = -2
# Locations kept per finding: enough to find the pattern, few enough to stay a small file.
MAX_LOCATIONS = 5
# Whitespace-only targets skipped back over to find a run's last real token.
MAX_TRAILING_SPACE = 3
# Tokens per numpy chunk (bounded memory on any split size).
CHUNK_TOKENS = 1 << 22
# Hash mixing constants (splitmix64) and the seed of the per-position table.
_K1, _K2, _K3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_POSITION_SEED = 20_240_601


@dataclass(kw_only=True)
class Finding:
    count: int = 0
    locations: list[str] = field(default_factory=list)

    def add(self, count: int, locations: list[str]) -> None:
        self.count += count
        self.locations += locations[: MAX_LOCATIONS - len(self.locations)]


@dataclass(kw_only=True)
class SplitObservations:
    samples: int
    # (last token class, next token class) of target runs; classes are ids, NON_CONTROL or SAMPLE_END.
    run_ends: dict[tuple[int, int], Finding]
    control_inputs: dict[int, int]
    control_targets: dict[int, int]
    double_bos: Finding
    # control token text -> lines of data text that hold it literally
    literal_controls: dict[str, Finding]
    literal_lines: Finding
    hash_file: Path | None = None

    def hashes(self) -> np.ndarray:
        if self.hash_file is None or self.samples == 0:
            return np.empty(0, np.uint64)
        return np.fromfile(self.hash_file, dtype=np.uint64)

    @property
    def turns(self) -> int:
        return sum(finding.count for finding in self.run_ends.values())


def observe_split(
    cache_dir: Path,
    *,
    control: Mapping[int, str],
    literal: Mapping[str, int],
    bos_id: int | None,
    scan_text: bool,
    space_ids: Collection[int] = (),
    reasoning: ReasoningBlock | None = None,
    image_references: bool = False,
    image_placeholder: str | None = None,
    media_root: str | None = None,
) -> SplitObservations:
    """The split's observations, read from beside its cache or computed once and stored there. `scan_text`: the
    data files hold text (every format but tokenized). `reasoning`: the chat template's reasoning block, whose
    markers are data where the template reads them (the template is in the cache's key). `image_references`:
    input_output's <img>path</img> are images (an image-text run), not text: their tags are no literal controls.
    `image_placeholder`, `media_root`: the run's image parsing (LineParser's), so a record is parsed as training
    parses it (an image part is read, not refused as on a text-only run)."""
    cache_dir = Path(cache_dir)
    stored, hash_file = cache_dir / OBSERVATIONS_FILE, cache_dir / HASH_FILE
    if stored.is_file() and hash_file.is_file():
        loaded = _load(stored, hash_file)
        if loaded is not None:
            return loaded
    cache = TokenCache.open(cache_dir)
    observed, hashes = _observe_tokens(cache, control, bos_id, space_ids)
    if scan_text:
        # Only the records the scan read (stream mode scans a sample of the train split).
        observed.literal_controls, observed.literal_lines = scan_literal_controls(
            from_meta("split", cache.meta),
            literal,
            max_lines=int(cache.meta["records"]),
            reasoning=reasoning,
            image_references=image_references,
            image_placeholder=image_placeholder,
            media_root=media_root,
        )
    _store(observed, hashes, cache_dir)
    return observed


def _observe_tokens(
    cache: TokenCache, control: Mapping[int, str], bos_id: int | None, space_ids: Collection[int]
) -> tuple[SplitObservations, np.ndarray]:
    offsets, tokens, target = cache.flat("offsets"), cache.flat("tokens"), cache.flat("target")
    n = len(cache)
    size = max(max(control, default=0), max(space_ids, default=0), int(cache.max_token_id), 0) + 1
    is_control, is_space = np.zeros(size, bool), np.zeros(size, bool)
    is_control[list(control)] = True
    is_space[list(space_ids)] = True
    lengths = np.asarray(cache.lengths, np.int64) if n else np.zeros(0, np.int64)
    table = _position_table(int(lengths.max()) if n else 0)
    hashes = np.empty(n, np.uint64)
    run_ends: dict[tuple[int, int], Finding] = {}
    inputs, targets = np.zeros(len(is_control), np.int64), np.zeros(len(is_control), np.int64)
    double_bos = Finding()
    a = 0
    while a < n:
        # Whole samples, about CHUNK_TOKENS tokens (at least one sample however long).
        b = min(max(int(np.searchsorted(offsets, offsets[a] + CHUNK_TOKENS, side="right")) - 1, a + 1), n)
        lo, hi = int(offsets[a]), int(offsets[b])
        ids = np.asarray(tokens[lo:hi], np.int64)
        tgt = np.asarray(target[lo:hi]).astype(bool)
        starts, lens = np.asarray(offsets[a:b], np.int64) - lo, lengths[a:b]
        _runs(ids, tgt, starts, lens, is_control, is_space, cache, a, run_ends)
        used = is_control[ids]
        inputs += np.bincount(ids[used], minlength=len(inputs))
        targets += np.bincount(ids[used & tgt], minlength=len(targets))
        if bos_id is not None:
            second = np.minimum(starts + 1, len(ids) - 1)
            double = np.flatnonzero((lens >= 2) & (ids[starts] == bos_id) & (ids[second] == bos_id))
            double_bos.add(len(double), [cache.location(a + int(i)) for i in double[:MAX_LOCATIONS]])
        hashes[a:b] = _hash_samples(ids, tgt, starts, lens, table)
        a = b
    if cache.images:  # an image-text sample is its tokens and its images: other images, another sample
        mixed = [
            int.from_bytes(hashlib.blake2b(f"{int(h)}|{refs!r}".encode(), digest_size=8).digest(), "little")
            for h, refs in zip(hashes, cache.images, strict=True)
        ]
        hashes = np.asarray(mixed, np.uint64)
    observed = SplitObservations(
        samples=n,
        run_ends=run_ends,
        double_bos=double_bos,
        literal_controls={},
        literal_lines=Finding(),
        control_inputs={int(i): int(inputs[i]) for i in np.flatnonzero(inputs)},
        control_targets={int(i): int(targets[i]) for i in np.flatnonzero(targets)},
    )
    return observed, hashes


def _runs(
    ids: np.ndarray,
    tgt: np.ndarray,
    starts: np.ndarray,
    lens: np.ndarray,
    is_control: np.ndarray,
    is_space: np.ndarray,
    cache: TokenCache,
    first_sample: int,
    run_ends: dict[tuple[int, int], Finding],
) -> None:
    """Count the (last token, next token) classes of every maximal run of targets, within each sample."""
    is_last = np.zeros(len(ids), bool)
    is_last[starts + lens - 1] = True
    is_first = np.zeros(len(ids), bool)
    is_first[starts] = True
    following = np.zeros(len(ids), bool)
    following[:-1] = tgt[1:]
    ends = np.flatnonzero(tgt & (is_last | ~following))
    if not len(ends):
        return
    # The last real token: step back over trailing whitespace targets that follow another target of the run.
    real = ends.copy()
    for _ in range(MAX_TRAILING_SPACE):
        back = is_space[ids[real]] & ~is_first[real] & tgt[np.maximum(real - 1, 0)]
        real = real - back
    last = ids[real]
    end_class = np.where(is_control[last], last, NON_CONTROL)
    after = ids[np.minimum(ends + 1, len(ids) - 1)]
    next_class = np.where(is_last[ends], SAMPLE_END, np.where(is_control[after], after, NON_CONTROL))
    sample = np.searchsorted(starts, ends, side="right") - 1 + first_sample
    pairs = np.stack([end_class, next_class], axis=1)
    unique, inverse, counts = np.unique(pairs, axis=0, return_inverse=True, return_counts=True)
    # Runs grouped by class, in sample order within each group: the first few of each are its locations.
    grouped = np.split(sample[np.argsort(inverse.ravel(), kind="stable")], np.cumsum(counts)[:-1])
    for (end, nxt), count, samples in zip(unique.tolist(), counts.tolist(), grouped, strict=False):
        first = dict.fromkeys(samples[: MAX_LOCATIONS * 4].tolist())
        finding = run_ends.setdefault((end, nxt), Finding())
        finding.add(count, [cache.location(i) for i in list(first)[:MAX_LOCATIONS]])


def _position_table(longest: int) -> np.ndarray:
    return np.random.default_rng(_POSITION_SEED).integers(0, 2**63, size=max(longest, 1), dtype=np.uint64)


def _hash_samples(
    ids: np.ndarray, tgt: np.ndarray, starts: np.ndarray, lens: np.ndarray, table: np.ndarray
) -> np.ndarray:
    """A 64-bit hash per sample of its token ids and target mask, order-sensitive, all in numpy."""
    if not len(lens):
        return np.empty(0, np.uint64)
    position = np.arange(len(ids)) - np.repeat(starts, lens)
    x = (ids.astype(np.uint64) << np.uint64(1)) | tgt.astype(np.uint64)
    x = x * _K1 + table[position]
    x ^= x >> np.uint64(31)
    x *= _K2
    x ^= x >> np.uint64(29)
    return np.add.reduceat(x, starts) ^ (lens.astype(np.uint64) * _K3)


def literal_pattern(literal: Mapping[str, int]) -> tuple[re.Pattern[bytes] | None, dict[bytes, str]]:
    """A bytes regex for every control token text as it appears inside a JSON string (escaped as json.dumps does,
    and with `/` escaped as some writers do), and each matched form's token text. The alternatives are merged into
    a trie: a vocabulary with thousands of reserved tokens (`<unused123>`) costs one walk per `<`, not thousands."""
    forms: dict[bytes, str] = {}
    for text in literal:
        escaped = json.dumps(text)[1:-1]
        for form in (escaped, escaped.replace("/", "\\/")):
            forms[form.encode()] = text
    if not forms:
        return None, forms
    return re.compile(_trie_regex(list(forms))), forms


def _trie_regex(words: list[bytes]) -> bytes:
    root: dict = {}
    for word in words:
        node = root
        for byte in word:
            node = node.setdefault(byte, {})
        node[None] = True  # a word ends here

    def build(node: dict) -> bytes:
        branches = [
            re.escape(bytes([byte])) + build(child)
            for byte, child in sorted((k, v) for k, v in node.items() if k is not None)
        ]
        if not branches:
            return b""
        body = branches[0] if len(branches) == 1 else b"(?:" + b"|".join(branches) + b")"
        # Greedy: the longest token wins where one token's text starts another's.
        return b"(?:" + body + b")?" if None in node else body

    return build(root)


# input_output's image reference as the raw JSON holds it (`/` may be escaped), as formats.MEDIA_PATTERN reads it.
_IMAGE_REFERENCE_BYTES = re.compile(rb"<(img|image)>.*?<\\?/\1>", re.DOTALL)


def scan_literal_controls(
    split: SplitInput,
    literal: Mapping[str, int],
    *,
    max_lines: int = 0,
    reasoning: ReasoningBlock | None = None,
    image_references: bool = False,
    image_placeholder: str | None = None,
    media_root: str | None = None,
) -> tuple[dict[str, Finding], Finding]:
    """Records of `split` (the first `max_lines`, 0 = all) whose text holds a control token's string, per token
    and in all (a columnar row is searched as its JSON). A record holding `reasoning`'s markers is parsed as
    training parses it: they count only where they remain in its text after the parser took each reply's opening
    reasoning block out (elsewhere in a reply, in a prompt, a second block, a string pair). `image_placeholder`,
    `media_root`: the run's image parsing (LineParser's)."""
    pattern, forms = literal_pattern(literal)
    markers = {reasoning.open, reasoning.close} if reasoning is not None else set()
    parsers: dict[str, LineParser] = {}
    per_token: dict[str, Finding] = {}
    lines = Finding()
    if pattern is None:
        return per_token, lines
    for read, record in enumerate(split.records(), start=1):
        if max_lines and read > max_lines:
            break
        raw = (
            record.payload
            if isinstance(record.payload, bytes)
            else json.dumps(record.payload, ensure_ascii=False, default=str).encode("utf-8")
        )
        if image_references:  # the parser reads them as images (Gemma 3's tokenizer has <img> as a control)
            raw = _IMAGE_REFERENCE_BYTES.sub(b"", raw)
        found = dict.fromkeys(forms[match] for match in pattern.findall(raw))
        if reasoning is not None and markers.intersection(found):
            misplaced = _misplaced(record, split, parsers, reasoning, (image_placeholder, media_root))
            found = {text: None for text in found if text not in markers or text in misplaced}
        if not found:
            continue
        location = f"{record.path}:{record.number}"
        lines.add(1, [location])
        for text in found:
            per_token.setdefault(text, Finding()).add(1, [location])
    return per_token, lines


def _misplaced(
    record,
    split: SplitInput,
    parsers: dict[str, LineParser],
    reasoning: ReasoningBlock,
    images: tuple[str | None, str | None],
) -> dict[str, None]:
    """The reasoning markers left in a record's text once parsed with the template's reasoning block (all of them
    when the parser rejects the record: it is then judged as written). Parsed with the run's image settings: a
    text-only parser would reject every image record of an image-text run, and judge its markers as written.
    `images`: the run's (image_placeholder, media_root)."""
    source = split.sources[record.source]
    parser = parsers.get(str(record.path))
    if parser is None:
        parser = parsers[str(record.path)] = LineParser(
            fmt=source.format,
            file=str(record.path),
            columns=dict(source.columns or {}),
            reasoning=reasoning,
            image_placeholder=images[0],
            media_root=images[1],
        )
    parsed = parser.parse(record.number, record.payload)
    markers = (reasoning.open, reasoning.close)
    if isinstance(parsed, Reject):
        return dict.fromkeys(markers)
    return dict.fromkeys(m for m in markers for _, text in record_texts(parsed) if m in text)


def _store(observed: SplitObservations, hashes: np.ndarray, cache_dir: Path) -> None:
    """Write beside the published cache, atomically (jobs of a sweep may race; their results are identical)."""
    hash_tmp = cache_dir / f".{HASH_FILE}.{os.getpid()}.tmp"
    hashes.astype(np.uint64).tofile(hash_tmp)
    os.replace(hash_tmp, cache_dir / HASH_FILE)
    body = asdict(observed)
    body.pop("hash_file", None)
    body["run_ends"] = [{"end": end, "next": nxt, **asdict(f)} for (end, nxt), f in observed.run_ends.items()]
    tmp = cache_dir / f".{OBSERVATIONS_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(body))
    os.replace(tmp, cache_dir / OBSERVATIONS_FILE)
    observed.hash_file = cache_dir / HASH_FILE


def _load(path: Path, hash_file: Path) -> SplitObservations | None:
    """The stored observations, or None when either file is damaged (they are then computed again)."""
    try:
        body = json.loads(path.read_text())
        observed = SplitObservations(
            samples=body["samples"],
            run_ends={
                (r["end"], r["next"]): Finding(count=r["count"], locations=r["locations"]) for r in body["run_ends"]
            },
            control_inputs={int(k): v for k, v in body["control_inputs"].items()},
            control_targets={int(k): v for k, v in body["control_targets"].items()},
            double_bos=Finding(**body["double_bos"]),
            literal_controls={k: Finding(**v) for k, v in body["literal_controls"].items()},
            literal_lines=Finding(**body["literal_lines"]),
            hash_file=hash_file,
        )
        intact = hash_file.stat().st_size == observed.samples * np.dtype(np.uint64).itemsize
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return observed if intact else None
