"""samples.html: the shown samples as one self-contained page (inline CSS, no script, no external asset).

A recipe may add a section of tables below preflight's samples (`add_section`): GRPO's completions at each eval
step, with each prompt, its completions and their rewards, rewritten at every eval.

Every token is a <span class="tok ..."> with its id in the title: `target` (trained) or `prompt` (not trained),
plus `bos` / `eos` / `eot` / `special` for control tokens and `cut` where the over-length policy removed tokens.
A legend at the top explains the marks; each sample names its split, why it was picked and its file:line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

from seqtune.config.rundir import RUN_DIR_KEY
from seqtune.data.images import stored_image
from seqtune.files import write_atomic
from seqtune.preflight.samples import ShownSample, ShownToken
from seqtune.preflight.thumbnails import THUMBNAIL_CSS, image_thumbnails_html

SAMPLES_HTML = "samples.html"

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 72rem;
       color: #1f2328; padding: 0 1rem; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.15rem; margin-top: 2rem; border-bottom: 1px solid #d0d7de; }
.run, .meta { color: #57606a; font-size: .9rem; }
.legend { position: sticky; top: 0; background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 6px;
          padding: .5rem .8rem; font-size: .9rem; z-index: 1; }
.legend .tok { margin-right: .8rem; }
.sample { border: 1px solid #d0d7de; border-radius: 6px; margin: 1rem 0; padding: .6rem 1rem; }
.pair { display: flex; gap: 1rem; } .pair > .sample { flex: 1 1 0; min-width: 0; }
.member-chosen { border-color: #1a7f37; } .member-rejected { border-color: #cf222e; }
.meta { margin-bottom: .5rem; } .meta code { color: #1f2328; }
.tokens { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .85rem;
          white-space: pre-wrap; word-break: break-word; line-height: 1.7; }
.tok { border-radius: 2px; }
.prompt { color: #6e7781; }
.target { background: #dafbe1; color: #0a3622; box-shadow: inset 0 -2px 0 #1a7f37; }
.bos, .eos, .eot, .special { font-weight: 600; padding: 0 2px; outline: 1px solid #8c959f; }
.bos { background: #ddf4ff; } .eos { background: #ffebe9; } .eot { background: #fff8c5; }
.special { background: #eaeef2; }
.target.bos, .target.eos, .target.eot, .target.special { box-shadow: inset 0 -3px 0 #1a7f37; }
.cut { color: #8250df; font-style: italic; outline: 1px dashed #8250df; padding: 0 3px; }
.elided { color: #57606a; font-style: italic; outline: 1px dotted #8c959f; padding: 0 3px; }
.nl { color: #afb8c1; }
table.completions { border-collapse: collapse; width: 100%; font-size: .85rem; margin: .5rem 0 1.5rem; }
table.completions th, table.completions td { border: 1px solid #d0d7de; padding: .3rem .5rem; vertical-align: top;
          text-align: left; }
table.completions td.text { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
          white-space: pre-wrap; word-break: break-word; }
table.completions td.num { text-align: right; font-variant-numeric: tabular-nums; }
"""

LEGEND = (
    ("tok target", "target: trained (its loss counts)"),
    ("tok prompt", "prompt: context only, not trained"),
    ("tok bos", "BOS"),
    ("tok eos", "EOS"),
    ("tok eot", "end-of-turn"),
    ("tok special", "other special token"),
    ("tok cut", "tokens cut by data.overlength"),
    ("tok elided", "middle of a long sample, not shown"),
)


# What a reader checks on each sample (the mistakes preflight's checks look for, seen by eye).
LOOK_FOR = (
    "Look for: every reply ends on an end-of-turn or EOS token marked as a target; the prompt and the "
    "template's headers are not marked; no special token sits inside the text; a cut sample kept its end."
)


def _token(token: ShownToken) -> str:
    classes = ["tok", "target" if token.target else "prompt"]
    if token.kind != "text":
        classes.append(token.kind)
    if token.kind in ("cut", "elided"):
        title = token.kind
    else:
        title = f"id {token.token_id}" + (" · target" if token.target else "")
    # A newline stays a line break, after a visible mark (a target that is only newlines must still show).
    text = escape(token.text).replace("\n", '<span class="nl">\u21b5</span>\n')
    return f'<span class="{" ".join(classes)}" title="{title}">{text}</span>'


def _sample(sample: ShownSample) -> str:
    cut = f", {sample.original_length} before the cut" if sample.original_length != sample.length else ""
    member = f"<b>{escape(sample.member)}</b> · " if sample.member != "sample" else ""
    meta = (
        f'<div class="meta">{member}<b>{escape(sample.why)}</b> · <code class="location">'
        f"{escape(sample.location)}</code> · {sample.length} tokens{cut} · {sample.targets} targets</div>"
    )
    tokens = "".join(_token(token) for token in sample.tokens)
    # An image-text sample: its images beside the text they stand in (thumbnails embedded in the page).
    images = image_thumbnails_html([stored_image(ref) for ref in sample.images]) if sample.images else ""
    return (
        f'<div class="sample member-{escape(sample.member)}" data-split="{escape(sample.split)}" '
        f'data-location="{escape(sample.location)}" data-member="{escape(sample.member)}" '
        f'data-targets="{sample.targets}">{meta}{images}<div class="tokens">{tokens}</div></div>'
    )


def _samples(samples: Sequence[ShownSample]) -> str:
    """Each sample in a box; the sequences of one sample (a pair's chosen and rejected) side by side."""
    out: list[str] = []
    group: list[ShownSample] = []
    for sample in samples:
        if group and (sample.member == "sample" or (sample.location, sample.why) != (group[0].location, group[0].why)):
            out.append(_group(group))
            group = []
        group.append(sample)
    if group:
        out.append(_group(group))
    return "".join(out)


def _group(group: list[ShownSample]) -> str:
    body = "".join(_sample(s) for s in group)
    return f'<div class="pair">{body}</div>' if len(group) > 1 else body


def page(samples: Sequence[ShownSample], *, title: str, summary: str) -> str:
    legend = "".join(f'<span class="{cls}">{escape(label)}</span>' for cls, label in LEGEND)
    sections = []
    for split in dict.fromkeys(s.split for s in samples):
        body = _samples([s for s in samples if s.split == split])
        sections.append(f'<section id="split-{escape(split)}"><h2>{escape(split)}</h2>{body}</section>')
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{_CSS}{THUMBNAIL_CSS}</style></head><body><h1>{escape(title)}</h1>"
        f'<p class="run">{escape(summary)}</p><p>{escape(LOOK_FOR)}</p>'
        f'<div class="legend" id="legend"><b>Legend</b> {legend}</div>'
        f"{''.join(sections)}</body></html>\n"
    )


def write_html(samples: Sequence[ShownSample], path: Path, *, title: str, summary: str) -> Path:
    """samples.html in the run directory, written atomically: a full disk is a clean error naming the path."""
    return write_atomic(path, page(samples, title=title, summary=summary), key=RUN_DIR_KEY)


_END = "</body></html>\n"


@dataclass(frozen=True, kw_only=True)
class Table:
    """One table of a section: its heading (and anchor id), column names, and rows of cell texts; the first
    `text_columns` cells of a row are text (monospace, wrapped), the rest numbers (right-aligned)."""

    heading: str
    anchor: str
    columns: Sequence[str]
    rows: Sequence[Sequence[str]]
    text_columns: int


def tables_section(section_id: str, heading: str, note: str, tables: Sequence[Table]) -> str:
    """A section of tables (every text escaped), e.g. an online recipe's completions at each eval."""
    parts = [f'<section id="{escape(section_id)}"><h2>{escape(heading)}</h2><p class="run">{escape(note)}</p>']
    for table in tables:
        head = "".join(f"<th>{escape(c)}</th>" for c in table.columns)
        body = "".join(
            "<tr>"
            + "".join(
                f'<td class="{"text" if i < table.text_columns else "num"}">{escape(cell)}</td>'
                for i, cell in enumerate(row)
            )
            + "</tr>"
            for row in table.rows
        )
        parts.append(
            f'<h3 id="{escape(table.anchor)}">{escape(table.heading)}</h3>'
            f'<table class="completions"><tr>{head}</tr>{body}</table>'
        )
    return "".join(parts) + "</section>"


def add_section(path: Path, section_id: str, section: str, *, title: str) -> Path:
    """samples.html with `section` (a tables_section) replacing the one of that id it had: below preflight's
    samples when it wrote them, else on a page of its own. Written atomically."""
    html = path.read_text(encoding="utf-8") if path.is_file() else page([], title=title, summary=str(path.parent))
    head = html.split(f'<section id="{escape(section_id)}">')[0].removesuffix(_END)
    return write_atomic(path, head + section + _END, key=RUN_DIR_KEY)
