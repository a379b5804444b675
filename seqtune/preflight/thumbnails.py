"""Thumbnails of a sample's images for samples.html: each image downscaled and embedded as a data: URI, so the page
stays one self-contained file (no script, no external asset, nothing it links to can move)."""

from __future__ import annotations

import base64
import io
from html import escape

from seqtune.data.images import ImageRef, ImageRefused, load_image

# The page's style for the thumbnails (samples_html's _CSS takes it in where a sample shows images).
THUMBNAIL_CSS = """
.thumbs { display: flex; flex-wrap: wrap; gap: .5rem; margin: .3rem 0 .5rem; }
.thumb { border: 1px solid #d0d7de; border-radius: 4px; image-rendering: pixelated; }
.thumb-refused { color: #cf222e; font-size: .85rem; border: 1px dashed #cf222e; padding: .2rem .4rem; }
"""


def image_thumbnails_html(refs: list[ImageRef], size: int = 96) -> str:
    """One <img> per reference, in order, at most `size` px on its longer side (never enlarged), titled with the
    reference as the record wrote it. An image that cannot be decoded shows Pillow's refusal in its place: the page
    is how one looks at what preflight refused."""
    assert size > 0, "a thumbnail has at least one pixel"
    return f'<div class="thumbs">{"".join(_thumbnail(ref, size) for ref in refs)}</div>'


def _thumbnail(ref: ImageRef, size: int) -> str:
    # A data: URI's text is the image itself: its media type and size say which one it is.
    title = escape(ref.source if ref.data is None else ref.name)
    try:
        image = load_image(ref)
    except ImageRefused as refused:
        return f'<span class="thumb-refused" title="{title}">{escape(refused.reason)}</span>'
    image.thumbnail((size, size))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
    return (
        f'<img class="thumb" src="{escape(uri)}" title="{title}" alt="{title}" '
        f'width="{image.width}" height="{image.height}">'
    )
