"""A split of plain files in one format, outside any config (tests build splits this way; runs build them from
data.* in seqtune.data.split)."""

from __future__ import annotations

from pathlib import Path

from seqtune.config.schema import DataFormat
from seqtune.data.sources import SourceFiles
from seqtune.data.split import SplitInput


def files_split(name: str, files: list[Path], fmt: str, columns: dict[str, str] | None = None) -> SplitInput:
    source = SourceFiles(
        key=f"data.{name}",
        files=tuple(Path(f) for f in files),
        format=DataFormat(fmt),
        columns=dict(columns or {}),
        columns_key="data.columns",
    )
    return SplitInput(name=name, sources=(source,))


def scan_files(name: str, files: list[Path], encoder, **kwargs):
    """scan_split over plain files in the encoder's format (one source)."""
    from seqtune.data.scan import scan_split

    return scan_split(files_split(name, files, encoder.fmt), {encoder.fmt: encoder}, **kwargs)


def observe_chat_file(data: Path, tokenizer, cache_root: Path):
    """(scan, observed): a chat file scanned and its token runs observed as preflight does (the tokenizer's control
    tokens, the literal ones written in text, its whitespace ids), for the terminator and literal-token checks."""
    from seqtune.data.tokenize import SampleEncoder
    from seqtune.preflight.observe import observe_split
    from seqtune.tokenizers.control import control_tokens, literal_controls, whitespace_ids

    encoder = SampleEncoder(tokenizer, "chat", train_on_prompt=False)
    scan = scan_files("train", [data], encoder, cache_root=cache_root)
    observed = observe_split(
        scan.cache_dir,
        control=control_tokens(tokenizer),
        literal=literal_controls(tokenizer),
        bos_id=encoder.bos_id,
        scan_text=True,
        space_ids=whitespace_ids(tokenizer),
    )
    return scan, observed
