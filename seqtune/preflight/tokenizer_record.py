"""The tokenizer facts preflight reads, kept under the token cache root, so that a re-run loads no tokenizer at all.

Loading a real tokenizer costs a second or more (importing transformers, parsing a 9-33 MB tokenizer.json), and
everything preflight reads off it is a handful of small values: the plan's vocabulary facts, its Tokens (bos as the
encoder adds it, terminators), the fingerprint in the token cache's key, the control, literal and whitespace ids the
content checks count, the presets of tokenizer.json, the chat template's note on earlier turns and its reasoning
block. `build_record`
computes them from the loaded tokenizer with the very functions preflight calls otherwise (the record stores their
results, it re-derives nothing), and the record is stored under a key over everything they depend on
(`record_key`): the bytes of every tokenizer file the loader may read, the tokenizer settings, the family's default
template and end-of-turn token, the data formats (whether records are templated), and the versions of the
libraries that load and render it. A changed input is a new key; a record that does not parse, or whose checksum
does not match its body, is ignored and written again. A run with a valid record never imports transformers unless
it must encode (a token cache miss) or decode (preflight.show): `RunTokenizer.load` loads it then.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqtune.config.errors import SeqtuneError
from seqtune.config.plan import Resolved, Tokens
from seqtune.config.schema import SPLITS, RootConfig
from seqtune.data.cache import CACHE_KEY, file_fingerprint
from seqtune.files import write_atomic
from seqtune.models.auto import spec_for
from seqtune.tokenizers import templates
from seqtune.tokenizers.facts import TokenizerFacts
from seqtune.tokenizers.location import resolve_location

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Bump when what a record holds, or how any of its facts is computed, changes: old records then stop matching, and
# the run rebuilds the record from the tokenizer (the version is in record_key; a body lacking a field is unreadable,
# read_record's None). v3 added tokens.turn_closer: a checkpoint written under v2 (its plan without the field)
# resumes, the closer derived again from the same tokenizer; v2 refused message prompts whose closer was no stop id,
# so GRPO's sampling stops where it did (tests/integration/test_grpo.py resumes one bitwise).
RECORD_VERSION = 3
RECORD_DIR = "tokenizer-facts"
# Every file a Hugging Face tokenizer load may read (AutoTokenizer reads config.json for the model type); a
# checkpoint directory's weights are not among them.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tekken.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
)
TEMPLATES_DIR = "additional_chat_templates"
# The libraries whose behaviour the facts depend on: loading, converting, rendering the chat template.
LIBRARIES = ("transformers", "tokenizers", "sentencepiece", "jinja2")


@dataclass(frozen=True, kw_only=True)
class TokenizerRecord:
    """What preflight reads off the loaded tokenizer, each value as the function named beside it returned it."""

    facts: TokenizerFacts  # tokenizer_facts: the plan's vocabulary (size, special ids, pad, eos)
    fingerprint: str  # tokenizer_fingerprint: the token cache's key
    tokens: Tokens  # token_facts: the plan's Tokens
    control: dict[int, str]  # control_tokens
    literal: dict[str, int]  # literal_controls
    spaces: list[int]  # whitespace_ids, sorted
    bos_token_id: int | None  # tokenizer.bos_token_id (checked against a checkpoint's config)
    presets: tuple[dict | None, dict | None]  # content.tokenizer_presets: truncation, padding
    earlier_turns_note: str | None  # templates.earlier_turns_note, for templated records (else None)
    reasoning: templates.ReasoningBlock | None  # templates.reasoning_block, for templated records (else None)


def build_record(cfg: RootConfig, plan: Resolved, tokenizer: PreTrainedTokenizerBase) -> TokenizerRecord:
    """The record of the loaded tokenizer (what the run would read off it)."""
    from seqtune.preflight.content import tokenizer_presets
    from seqtune.preflight.tokens import token_facts
    from seqtune.tokenizers.control import control_tokens, literal_controls, whitespace_ids
    from seqtune.tokenizers.facts import tokenizer_facts
    from seqtune.tokenizers.info import tokenizer_fingerprint

    tokens = token_facts(cfg, plan, tokenizer)
    location = resolve_location(cfg.tokenizer, cfg.model)
    truncation, padding = tokenizer_presets(location.directory / "tokenizer.json", tokenizer)
    return TokenizerRecord(
        facts=tokenizer_facts(tokenizer, eot_token=spec_for(cfg.model).eot_token),
        fingerprint=tokenizer_fingerprint(tokenizer),
        tokens=tokens,
        control=control_tokens(tokenizer),
        literal=literal_controls(tokenizer),
        spaces=sorted(whitespace_ids(tokenizer)),
        bos_token_id=tokenizer.bos_token_id,
        presets=(truncation, padding),
        earlier_turns_note=templates.earlier_turns_note(tokenizer) if tokens.templated else None,
        reasoning=templates.reasoning_block(tokenizer) if tokens.templated else None,
    )


def record_key(cfg: RootConfig) -> str | None:
    """sha256 over everything the record's facts depend on; None when the tokenizer cannot be located or its
    settings do not resolve (the run then loads it, and the loader reports why)."""
    spec = spec_for(cfg.model)
    try:
        directory = resolve_location(cfg.tokenizer, cfg.model).directory
        override = templates.resolve(cfg.tokenizer.chat_template) if cfg.tokenizer.chat_template else None
        paths = [directory / name for name in TOKENIZER_FILES] + sorted((directory / TEMPLATES_DIR).glob("*"))
        files = {str(path.relative_to(directory)): file_fingerprint(path) for path in paths if path.is_file()}
        formats = sorted({str(source.format) for split in SPLITS for source in cfg.data.sources(split)})
    except (SeqtuneError, OSError):
        return None
    inputs = {
        "version": RECORD_VERSION,
        "libraries": {name: _version(name) for name in LIBRARIES},
        "files": files,
        "tokenizer": {**asdict(cfg.tokenizer), "chat_template": override},
        "family_chat_template": spec.chat_template,
        "eot_token": spec.eot_token,
        "formats": formats,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def record_path(cache_root: Path, key: str) -> Path:
    return Path(cache_root) / RECORD_DIR / f"{key}.json"


def read_record(cache_root: Path, key: str | None) -> TokenizerRecord | None:
    """The stored record, or None when there is none, or it is damaged (unparseable, truncated, edited: its
    checksum covers the body) or not this key's."""
    if key is None:
        return None
    try:
        stored = json.loads(record_path(cache_root, key).read_text(encoding="utf-8"))
        body = stored["body"]
        if stored["sha256"] != _checksum(body) or body["key"] != key:
            return None
        return _from_body(body)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_record(cache_root: Path, key: str | None, record: TokenizerRecord) -> None:
    """Store the record atomically. Best effort: a cache root that cannot be written only costs the next run the
    tokenizer load (the token cache itself reports an unwritable root)."""
    if key is None:
        return
    body = json.loads(json.dumps({**_to_body(record), "key": key}))  # as it reads back: ids as string keys
    try:
        record_path(cache_root, key).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(record_path(cache_root, key), json.dumps({"sha256": _checksum(body), "body": body}), key=CACHE_KEY)
    except (OSError, SeqtuneError):
        pass


def keep_record(cfg: RootConfig, cache_root: Path, key: str | None, record: TokenizerRecord) -> None:
    """write_record under `key`, the key computed before the tokenizer loaded, unless its files changed meanwhile
    (a record must never describe other files than its key's)."""
    if key is not None and record_key(cfg) == key:
        write_record(cache_root, key, record)


def _checksum(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _to_body(record: TokenizerRecord) -> dict[str, Any]:
    body = asdict(record)
    body["presets"] = list(record.presets)
    return body


def _from_body(body: dict[str, Any]) -> TokenizerRecord:
    """The record from its JSON body (JSON keys are strings: ids are made ints again; every field is required)."""
    facts, tokens = body["facts"], body["tokens"]
    truncation, padding = body["presets"]
    return TokenizerRecord(
        facts=TokenizerFacts(
            size=int(facts["size"]),
            special_ids={str(k): int(v) for k, v in facts["special_ids"].items()},
            pad_id=_int_or_none(facts["pad_id"]),
            eos_id=_int_or_none(facts["eos_id"]),
        ),
        fingerprint=str(body["fingerprint"]),
        tokens=Tokens(
            pad_id=int(tokens["pad_id"]),
            bos_id=_int_or_none(tokens["bos_id"]),
            eos_id=int(tokens["eos_id"]),
            terminators={int(k): str(v) for k, v in tokens["terminators"].items()},
            templated=bool(tokens["templated"]),
            turn_closer=_int_or_none(tokens["turn_closer"]),
        ),
        control={int(k): str(v) for k, v in body["control"].items()},
        literal={str(k): int(v) for k, v in body["literal"].items()},
        spaces=[int(i) for i in body["spaces"]],
        bos_token_id=_int_or_none(body["bos_token_id"]),
        presets=(truncation, padding),
        earlier_turns_note=body["earlier_turns_note"],
        reasoning=None if body["reasoning"] is None else templates.ReasoningBlock(**body["reasoning"]),
    )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


class RunTokenizer:
    """The run's tokenizer as preflight uses it: its record at once, the loaded tokenizer on first `load()` (a
    token cache miss encodes, preflight.show decodes). A tokenizer loaded for a stored record must be the one it
    describes (its fingerprint), else the record is a bug."""

    def __init__(self, cfg: RootConfig, record: TokenizerRecord, loaded: PreTrainedTokenizerBase | None = None) -> None:
        self._cfg, self.record, self._loaded = cfg, record, loaded

    def load(self) -> PreTrainedTokenizerBase:
        if self._loaded is None:
            from seqtune.tokenizers import load_tokenizer
            from seqtune.tokenizers.info import tokenizer_fingerprint

            spec = spec_for(self._cfg.model)
            loaded = load_tokenizer(self._cfg.tokenizer, self._cfg.model, default_chat_template=spec.chat_template)
            if tokenizer_fingerprint(loaded) != self.record.fingerprint:
                raise RuntimeError(
                    "seqtune bug: the stored tokenizer record does not describe the tokenizer loaded from the same "
                    "files; please report it (deleting data.cache_dir's tokenizer-facts directory works around it)."
                )
            self._loaded = loaded
        return self._loaded
