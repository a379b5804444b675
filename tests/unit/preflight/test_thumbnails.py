"""samples.html's image thumbnails (seqtune.preflight.thumbnails) on real PNG files, read back by an HTML parser."""

from __future__ import annotations

import base64
import io
from html.parser import HTMLParser
from pathlib import Path

from PIL import Image

from seqtune.data.images import resolve_image
from seqtune.preflight.thumbnails import image_thumbnails_html

WHERE = "train.jsonl:3"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _parsed(html: str) -> _Tags:
    parser = _Tags()
    parser.feed(html)
    return parser


def _png(path: Path, size: tuple[int, int], colour=(10, 120, 240)) -> bytes:
    Image.new("RGB", size, colour).save(path, format="PNG")
    return path.read_bytes()


def _decoded(src: str) -> Image.Image:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix)
    return Image.open(io.BytesIO(base64.b64decode(src[len(prefix) :])))


def test_each_image_is_embedded_downscaled_in_order_and_titled_with_its_reference(tmp_path):
    _png(tmp_path / "wide.png", (200, 100))
    _png(tmp_path / 'odd "<name>" & co.png', (40, 30), (250, 0, 0))
    refs = [resolve_image(name, tmp_path, WHERE) for name in ("wide.png", 'odd "<name>" & co.png')]
    html = image_thumbnails_html(refs, size=96)
    assert '"<name>"' not in html  # the reference is escaped, not markup
    images = [attrs for tag, attrs in _parsed(html).tags if tag == "img"]
    assert [a["title"] for a in images] == ["wide.png", 'odd "<name>" & co.png']
    assert [(a["width"], a["height"]) for a in images] == [("96", "48"), ("40", "30")]  # small ones stay as they are
    wide, odd = (_decoded(a["src"]) for a in images)
    assert (wide.size, odd.size, odd.convert("RGB").getpixel((5, 5))) == ((96, 48), (40, 30), (250, 0, 0))


def test_a_data_uri_is_titled_by_its_type_and_size_and_a_corrupt_image_shows_its_refusal(tmp_path):
    png = _png(tmp_path / "x.png", (20, 20))
    (tmp_path / "cut.png").write_bytes(png[: len(png) // 2])
    inline = resolve_image("data:image/png;base64," + base64.b64encode(png).decode(), tmp_path, WHERE)
    html = image_thumbnails_html([inline, resolve_image("cut.png", tmp_path, WHERE)], size=8)
    parsed = _parsed(html)
    (img,) = [attrs for tag, attrs in parsed.tags if tag == "img"]
    assert img["title"] == f"data:image/png;base64 URI of {len(png)} bytes"
    assert _decoded(img["src"]).size == (8, 8)
    refused = [attrs for tag, attrs in parsed.tags if attrs.get("class") == "thumb-refused"]
    assert [a["title"] for a in refused] == ["cut.png"]
    assert any(text.startswith("bad_image: ") and "cut.png cannot be decoded" in text for text in parsed.text)


def test_no_images_give_an_empty_strip():
    assert _parsed(image_thumbnails_html([])).tags == [("div", {"class": "thumbs"})]
