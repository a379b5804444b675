"""See what the model will be trained on: per split the longest sample, a truncated one (if any) and
preflight.show random ones, exactly as training serves them (over-length policy applied), decoded token by token
with the targets marked and bos / eos / end-of-turn made visible, each with its file:line.

Written to samples.html (seqtune.preflight.samples_html) and samples.json (the W&B table reads it); one sample is
printed on the console, in colour on a terminal.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from seqtune.config.errors import SeqtuneError
from seqtune.config.rundir import RUN_DIR_KEY
from seqtune.data.cache import TokenCache
from seqtune.data.overlength import kept_positions
from seqtune.data.scan import SplitScan
from seqtune.data.types import IGNORE_INDEX
from seqtune.files import write_atomic

SAMPLES_JSON = "samples.json"
# The shown samples kept under the token cache root (collect_stored).
SHOWN_DIR = "shown"
# Marks of targets on a console without colour (and in the W&B table's text column).
TARGET_OPEN, TARGET_CLOSE = "\u27e6", "\u27e7"
# The console shows at most this many tokens of its sample, samples.html this many per sample: the head and the
# tail (where the terminator is).
CONSOLE_TOKENS = 160
MAX_SHOWN_TOKENS = 4096


@dataclass(kw_only=True)
class ShownToken:
    text: str
    token_id: int  # -1 for a cut marker
    target: bool
    kind: str


@dataclass(kw_only=True)
class ShownSample:
    split: str
    why: str  # longest | truncated | random (a longest that is cut says "longest, truncated")
    location: str
    # Which sequence of its sample it is: "sample" (SFT), "chosen" / "rejected" (a preference pair, shown side by
    # side: its sample kind's members, seqtune.data.kinds).
    member: str = "sample"
    length: int  # tokens as trained
    original_length: int
    targets: int
    tokens: list[ShownToken] = field(default_factory=list)
    # An image-text sample's images (stored references, in the order of their token runs): shown as thumbnails.
    images: list[str] = field(default_factory=list)
    # False for a kind whose targets do not train (a prompt: its one target is an anchor, its completions are
    # sampled): shown as the prompt sampling starts from, with no target marked.
    trains: bool = True

    def marked_text(self) -> str:
        """The sample as text, targets between TARGET_OPEN and TARGET_CLOSE."""
        out, inside = [], False
        for token in self.tokens:
            if token.target != inside:
                out.append(TARGET_OPEN if token.target else TARGET_CLOSE)
                inside = token.target
            out.append(token.text)
        return "".join(out) + (TARGET_CLOSE if inside else "")


@dataclass(kw_only=True)
class TokenKinds:
    """Which ids are drawn as what: bos, eos, the end-of-turn tokens, every other control token."""

    bos: int | None
    eos: int
    eot: frozenset[int]
    control: frozenset[int]

    def of(self, token_id: int) -> str:
        if token_id == self.bos:
            return "bos"
        if token_id == self.eos:
            return "eos"
        if token_id in self.eot:
            return "eot"
        return "special" if token_id in self.control else "text"


def pick(
    lengths: np.ndarray, *, max_seq_len: int, policy: str, show: int, seed: int | list[int]
) -> list[tuple[int, str]]:
    """(sample index, why) of the samples to show: the longest, a truncated one, `show` random ones. `lengths`: per
    sample (a pair's longest sequence)."""
    lengths = np.asarray(lengths)
    kept = np.flatnonzero(lengths <= max_seq_len) if policy == "drop" else np.arange(len(lengths))
    if not len(kept):
        return []
    cut = policy in ("truncate", "truncate_prompt")
    longest = int(kept[np.argmax(lengths[kept])])
    chosen = [(longest, "longest, truncated" if cut and lengths[longest] > max_seq_len else "longest")]
    over = [int(i) for i in kept if lengths[i] > max_seq_len and int(i) != longest] if cut else []
    if over:
        chosen.append((over[0], "truncated"))
    rest = np.setdiff1d(kept, [i for i, _ in chosen])
    rng = np.random.default_rng(seed)
    for i in sorted(rng.choice(rest, size=min(show, len(rest)), replace=False).tolist()):
        chosen.append((int(i), "random"))
    return chosen


def render(
    cache: TokenCache,
    index: int,
    *,
    split: str,
    why: str,
    max_seq_len: int,
    policy: str,
    tokenizer: Any,
    kinds: TokenKinds,
    member: str = "sample",
    trains: bool = True,
) -> ShownSample:
    """Sample `index` as training serves it, decoded token by token (a character split over several tokens is
    shown on the token that completes it), with a marker where the over-length policy removed tokens. A sample
    longer than MAX_SHOWN_TOKENS shows its head and its tail (where the terminator is)."""
    from tokenizers.decoders import DecodeStream

    sample = cache[index]
    original = len(sample)
    positions = np.arange(original)
    if original > max_seq_len and policy in ("truncate", "truncate_prompt"):
        positions = positions[kept_positions(sample.labels, max_seq_len, policy)]
    trained = positions
    elide_at = None
    if len(positions) > MAX_SHOWN_TOKENS:
        half = MAX_SHOWN_TOKENS // 2
        positions, elide_at = np.concatenate([positions[:half], positions[-half:]]), half
    backend = tokenizer.backend_tokenizer
    tokens: list[ShownToken] = []
    previous = -1
    for k, position in enumerate(positions.tolist()):
        if k == elide_at:
            tokens.append(_marker("elided", len(trained) - 2 * elide_at, "not shown"))
        elif position != previous + 1:
            tokens.append(_marker("cut", position - previous - 1, "cut"))
        if k == 0 or k == elide_at or position != previous + 1:
            stream = DecodeStream(skip_special_tokens=False)
        token_id = int(sample.input_ids[position])
        tokens.append(
            ShownToken(
                text=stream.step(backend, token_id) or "",
                token_id=token_id,
                target=trains and bool(sample.labels[position] != IGNORE_INDEX),
                kind=kinds.of(token_id),
            )
        )
        previous = position
    if previous != original - 1:
        tokens.append(_marker("cut", original - 1 - previous, "cut"))
    return ShownSample(
        split=split,
        why=why,
        location=sample.location,
        member=member,
        length=len(trained),
        original_length=original,
        targets=int((sample.labels[trained] != IGNORE_INDEX).sum()),
        tokens=tokens,
        images=list(sample.images),
        trains=trains,
    )


def _marker(kind: str, count: int, what: str) -> ShownToken:
    return ShownToken(text=f"[{count} tokens {what}]", token_id=-1, target=False, kind=kind)


def collect(
    scans: dict[str, SplitScan],
    *,
    max_seq_len: int,
    policy: str,
    show: int,
    seed: int,
    tokenizer: Any,
    kinds: TokenKinds,
    members: tuple[str, ...] = ("sample",),
    trains: bool = True,
) -> list[ShownSample]:
    """The samples to show, each sequence of a sample in `members` order (a pair: chosen, then rejected); `trains`:
    the kind's targets train (False: prompts, shown without targets)."""
    shown = []
    k = len(members)
    for number, (name, scan) in enumerate(scans.items()):
        cache = scan.cache()
        per_sample = np.asarray(scan.lengths).reshape(-1, k).max(axis=1, initial=0)
        # One stream per split: the same seed would pick the same relative positions in every split.
        for index, why in pick(per_sample, max_seq_len=max_seq_len, policy=policy, show=show, seed=[seed, number]):
            for j, member in enumerate(members):
                shown.append(
                    render(
                        cache,
                        index * k + j,
                        split=name,
                        why=why,
                        max_seq_len=max_seq_len,
                        policy=policy,
                        tokenizer=tokenizer,
                        kinds=kinds,
                        member=member,
                        trains=trains,
                    )
                )
    return shown


def collect_stored(
    store: Path,
    scans: dict[str, SplitScan],
    *,
    max_seq_len: int,
    policy: str,
    show: int,
    seed: int,
    load_tokenizer: Callable[[], Any],
    kinds: TokenKinds,
    members: tuple[str, ...] = ("sample",),
    trains: bool = True,
) -> list[ShownSample]:
    """collect, kept in `store` by a digest of everything that decides it: each split's token cache (its directory
    is named by a content key over the data and the tokenizer), the choice's settings, the kinds, this module's
    code and the decoding library's version. A re-run reads it back without loading the tokenizer; a stored file
    that does not parse is ignored and written again."""
    settings = [max_seq_len, policy, show, seed, asdict(kinds), list(members), trains]
    digest = hashlib.sha256(json.dumps([settings, _version("tokenizers")], default=sorted).encode())
    digest.update(Path(__file__).read_bytes())
    digest.update(json.dumps([(name, scan.cache_dir.name) for name, scan in scans.items()]).encode())
    path = Path(store) / f"{digest.hexdigest()[:32]}.json"
    try:
        return [_shown_from_dict(row) for row in json.loads(path.read_text(encoding="utf-8"))]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    shown = collect(
        scans,
        max_seq_len=max_seq_len,
        policy=policy,
        show=show,
        seed=seed,
        tokenizer=load_tokenizer(),
        kinds=kinds,
        members=members,
        trains=trains,
    )
    try:  # best effort: an unwritable store only costs the next run the decoding
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps([asdict(sample) for sample in shown]), key="data.cache_dir")
    except (OSError, SeqtuneError):
        pass
    return shown


def _shown_from_dict(row: dict[str, Any]) -> ShownSample:
    tokens = [ShownToken(**token) for token in row.pop("tokens")]
    return ShownSample(**row, tokens=tokens)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def write_json(samples: list[ShownSample], path: Path) -> Path:
    """samples.json in the run directory, written atomically: a full disk is a clean error naming the path."""
    rows = [{**{k: v for k, v in asdict(s).items() if k != "tokens"}, "text": s.marked_text()} for s in samples]
    return write_atomic(path, json.dumps(rows, ensure_ascii=False, indent=1) + "\n", key=RUN_DIR_KEY)


def read_json(path: Path) -> list[dict[str, Any]]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


# --- the console --------------------------------------------------------------------------------------------------

_ANSI = {
    "target": "\x1b[42;30m",
    "prompt": "\x1b[2m",
    "bos": "\x1b[1;44;97m",
    "eos": "\x1b[1;41;97m",
    "eot": "\x1b[1;43;30m",
    "special": "\x1b[1;7m",
    "cut": "\x1b[1;35m",
    "elided": "\x1b[2;35m",
    "reset": "\x1b[0m",
}


def use_colour(stream: TextIO) -> bool:
    """Colour on a terminal unless NO_COLOR is set (https://no-color.org); FORCE_COLOR forces it."""
    if os.environ.get("NO_COLOR"):
        return False
    return bool(os.environ.get("FORCE_COLOR")) or bool(getattr(stream, "isatty", lambda: False)())


def console_text(sample: ShownSample, colour: bool) -> str:
    """One sample for the console: a header, a legend, the tokens (head and tail when it is long)."""
    tokens = sample.tokens
    if len(tokens) > CONSOLE_TOKENS:
        half = CONSOLE_TOKENS // 2
        tokens = [*tokens[:half], _marker("elided", len(tokens) - 2 * half, "not shown"), *tokens[-half:]]
    if not sample.trains:  # a prompt: nothing of it trains, its completions are sampled
        head = (
            f"preflight: a {sample.split} {sample.member} as sampling starts from it ({sample.why}, "
            f"{sample.location}, {sample.length} tokens); all samples: samples.html"
        )
        legend = "  legend: the whole sample is the prompt; its completions are sampled while training"
        return f"{head}\n{legend}\n{replace(sample, tokens=tokens).marked_text()}"
    member = f" ({sample.member})" if sample.member != "sample" else ""
    head = (
        f"preflight: a {sample.split} sample{member} as it will be trained ({sample.why}, {sample.location}, "
        f"{sample.length} tokens, {sample.targets} targets); all samples: samples.html"
    )
    if not colour:
        legend = f"  legend: {TARGET_OPEN}targets{TARGET_CLOSE}, the rest is prompt (not trained)"
        return f"{head}\n{legend}\n{replace(sample, tokens=tokens).marked_text()}"
    legend = "  legend: " + " ".join(
        f"{_ANSI[k]}{label}{_ANSI['reset']}"
        for k, label in (
            ("target", "target"),
            ("prompt", "prompt"),
            ("bos", "BOS"),
            ("eos", "EOS"),
            ("eot", "end-of-turn"),
            ("special", "special"),
        )
    )
    body = []
    for token in tokens:
        style = token.kind if token.kind != "text" else ("target" if token.target else "prompt")
        underline = "\x1b[4m" if token.target and token.kind != "text" else ""
        body.append(f"{_ANSI[style]}{underline}{token.text}{_ANSI['reset']}")
    return f"{head}\n{legend}\n{''.join(body)}"


def print_sample(samples: list[ShownSample], stream: TextIO | None = None) -> None:
    """The first random train sample (else the first shown) on the console."""
    if not samples:
        return
    stream = stream or sys.stdout
    sample = next((s for s in samples if s.split == "train" and s.why == "random"), samples[0])
    print(console_text(sample, use_colour(stream)), file=stream, flush=True)
