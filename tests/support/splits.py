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
