"""Which directory a tokenizer comes from, and the rules a tokenizer must meet, shared by the light facts reader
(facts.py, no transformers) and the full loader (load.py): both refuse the same inputs with the same message."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from seqtune.config.errors import ConfigError, ModelLoadError
from seqtune.config.schema import ModelConfig, PadPolicy, TokenizerConfig, TokenizerSource
from seqtune.tokenizers import pypi

BUNDLED_DIR = Path(__file__).resolve().parent / "assets" / "seqtune-bpe"
# pad_policy=add appends this token; the embedding must then grow (model.resize_embeddings=true).
ADDED_PAD_TOKEN = "[PAD]"
EXPECTED_FILES = "tokenizer.json, or tokenizer.model + tokenizer_config.json"
DIRECTORY_FIX = (
    "point it at a Hugging Face tokenizer directory, or set tokenizer.path=DIR (or tokenizer.source=bundled)."
)


@dataclass(kw_only=True, frozen=True)
class TokenizerLocation:
    directory: Path
    # The config key that chose the directory, named in every error about it.
    key: str
    value: str

    @property
    def has_json(self) -> bool:
        return (self.directory / "tokenizer.json").is_file()


def resolve_location(tok: TokenizerConfig, model: ModelConfig) -> TokenizerLocation:
    """The tokenizer directory `tok` names, checked to hold a tokenizer (else ModelLoadError naming the key)."""
    location = _location(tok, model)
    _check_directory(location)
    return location


def _location(tok: TokenizerConfig, model: ModelConfig) -> TokenizerLocation:
    source = tok.source
    if source == TokenizerSource.auto and not model.path and model.tiny_tokenizer:
        return _pypi_location(model.tiny_tokenizer)
    if source == TokenizerSource.auto:
        source = TokenizerSource.path if model.path else TokenizerSource.bundled
    if source == TokenizerSource.bundled:
        return TokenizerLocation(directory=BUNDLED_DIR, key="tokenizer.source", value="bundled")
    if source == TokenizerSource.pypi:
        return _pypi_location(tok.name)
    if tok.path:  # source == path
        return TokenizerLocation(directory=Path(tok.path).expanduser(), key="tokenizer.path", value=tok.path)
    if model.path:
        return TokenizerLocation(directory=Path(model.path).expanduser(), key="model.path", value=model.path)
    raise ModelLoadError(
        "tokenizer.source=path needs a directory but tokenizer.path and model.path are null.",
        key="tokenizer.path",
        fix="set tokenizer.path=DIR (a Hugging Face tokenizer directory).",
    )


def _pypi_location(name: str | None) -> TokenizerLocation:
    if name not in pypi.SOURCES:
        raise ConfigError(
            f"tokenizer.name={name!r} is not a PyPI tokenizer; known: {sorted(pypi.SOURCES)}.",
            key="tokenizer.name",
            fix="tokenizer.name=llama3 (or pick a tokenizer=... config group).",
        )
    directory = pypi.tokenizer_dir(name)
    if not pypi.is_cached(name):
        raise ModelLoadError(
            f"tokenizer.name={name}: not fetched yet: {directory} has no valid {pypi.STAMP_FILE} + tokenizer.json.",
            key="tokenizer.name",
            fix=f"run `bash scripts/setup.sh` to fetch pypi tokenizers (or `python scripts/fetch_tokenizers.py "
            f"--only {name}`); SEQTUNE_CACHE moves the cache root.",
        )
    return TokenizerLocation(directory=directory, key="tokenizer.name", value=name)


def _check_directory(location: TokenizerLocation) -> None:
    directory, key, value = location.directory, location.key, location.value
    if not directory.is_dir():
        raise ModelLoadError(
            f"{key}={value}: {directory} is not a directory (expected {EXPECTED_FILES}).", key=key, fix=DIRECTORY_FIX
        )
    has_spm = (directory / "tokenizer.model").is_file() and (directory / "tokenizer_config.json").is_file()
    if not (location.has_json or has_spm):
        found = sorted(p.name for p in directory.iterdir())[:12]
        raise ModelLoadError(
            f"{key}={value}: no tokenizer in {directory}: expected {EXPECTED_FILES}; found {found}.",
            key=key,
            fix=DIRECTORY_FIX,
        )


def require_eos(eos: str | None, location: TokenizerLocation) -> None:
    """eos is required (every sample trains one: the model must learn to stop). bos is not: Qwen2/2.5/3 and other
    GPT-2-style tokenizers have none (`"bos_token": null`), and their samples start without one."""
    if eos is None:
        raise ModelLoadError(
            f"{location.key}={location.value}: the tokenizer in {location.directory} has no eos_token.",
            key=location.key,
            fix=f"set eos_token in {location.directory}/tokenizer_config.json.",
        )


def pad_token_for(pad: str | None, eos: str, policy: PadPolicy, location: TokenizerLocation) -> str:
    """The pad token after tokenizer.pad_policy: the tokenizer's own, else eos (eos), else a new [PAD] (add)."""
    if pad is not None:
        return pad
    if policy == PadPolicy.eos:
        # Padding is masked by attention and label masks, never by id, so the real final eos still trains.
        return eos
    if policy == PadPolicy.add:
        return ADDED_PAD_TOKEN
    raise ConfigError(
        f"tokenizer.pad_policy=error and the tokenizer ({location.key}={location.value}) has no pad token.",
        key="tokenizer.pad_policy",
        fix="tokenizer.pad_policy=eos (reuse eos), or tokenizer.pad_policy=add with model.resize_embeddings=true.",
    )
