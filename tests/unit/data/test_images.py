"""Image references resolved under data.media_root, decoded, described and hashed (seqtune.data.images), on real
files: a PNG Pillow writes, a truncated one, a text file named .png, data: URIs, escapes and symlinks."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from seqtune.config.errors import EXIT_REFUSED, DataError
from seqtune.data.formats import LineParser, PromptCompletion
from seqtune.data.images import ImageRef, ImageRefused, describe_image, image_digest, load_image, resolve_image
from seqtune.data.types import Reject

WHERE = "train.jsonl:7"


def _png(size: tuple[int, int] = (8, 6), mode: str = "RGB", colour: tuple[int, ...] = (200, 10, 10)) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    media = tmp_path / "media"
    (media / "images").mkdir(parents=True)
    (media / "images" / "red.png").write_bytes(_png())
    return media


def _refusal(ref: str, root: Path) -> ImageRefused:
    with pytest.raises(ImageRefused) as caught:
        resolve_image(ref, root, WHERE)
    return caught.value


def test_a_relative_path_an_absolute_one_under_the_root_and_a_file_url_name_the_same_file(root):
    file = (root / "images" / "red.png").resolve()
    for ref in ("images/red.png", " ./images/../images/red.png ", str(root / "images/red.png"), file.as_uri()):
        image = resolve_image(ref, root, WHERE)
        assert (image.path, image.data, image.where) == (file, None, WHERE), ref
    assert resolve_image("file:images/red.png", root, WHERE).path == file
    assert resolve_image("images/red.png", root, WHERE).source == "images/red.png"


def test_a_symlinked_root_and_a_link_inside_it_are_followed(root, tmp_path):
    (tmp_path / "alias").symlink_to(root)
    (root / "same.png").symlink_to("images/red.png")
    via_alias = resolve_image(str(tmp_path / "alias" / "same.png"), tmp_path / "alias", WHERE)
    assert via_alias.path == (root / "images" / "red.png").resolve()


@pytest.mark.parametrize("ref", ["../secret.png", "images/../../secret.png", "/etc/passwd", "out.png", "file:///etc/x"])
def test_a_reference_leaving_the_root_is_refused_naming_where_the_reference_the_root_and_the_fix(root, tmp_path, ref):
    (tmp_path / "secret.png").write_bytes(_png())
    (root / "out.png").symlink_to(tmp_path / "secret.png")
    refused = _refusal(ref, root)
    assert isinstance(refused, DataError) and refused.exit_code == EXIT_REFUSED
    assert refused.code == "media_outside_root"
    message = str(refused)
    assert message.startswith(f"{WHERE}: media_outside_root: {ref} resolves outside {root.resolve()}")
    assert "Fix:" in message and "data.media_root" in message
    # What the record parsers file the record under: the same code, no location.
    assert refused.reason.startswith(f"media_outside_root: {ref} resolves outside") and WHERE not in refused.reason


def test_an_existing_and_a_missing_file_outside_the_root_get_the_same_answer(root, tmp_path):
    (tmp_path / "secret.png").write_bytes(_png())
    assert _refusal("../secret.png", root).code == _refusal("../nothing.png", root).code == "media_outside_root"


def test_a_missing_file_and_a_directory_are_refused(root):
    missing = _refusal("images/blue.png", root)
    assert missing.code == "missing_media"
    assert str(missing).startswith(f"{WHERE}: missing_media: images/blue.png not found under {root.resolve()}")
    assert "Fix: set data.media_root" in str(missing)
    directory = _refusal("images", root)
    assert directory.code == "media_not_file" and "is a directory under" in str(directory)
    assert _refusal("  ", root).code == "empty_media"


@pytest.mark.parametrize("ref", ["http://example.com/cat.png", "HTTPS://example.com/cat.png", "s3://bucket/cat.png"])
def test_a_url_is_refused_because_seqtune_reads_no_network(root, ref):
    refused = _refusal(ref, root)
    assert refused.code == "remote_media"
    assert "reads no network" in str(refused) and f"Fix: download the image into {root}" in str(refused)
    assert _refusal("file://otherhost/cat.png", root).code == "remote_media"


def test_a_data_uri_is_decoded_and_read_like_a_file(root):
    png = _png((5, 4))
    image = resolve_image("data:image/png;base64," + base64.b64encode(png).decode(), root, WHERE)
    assert (image.path, image.data) == (None, png)
    assert describe_image(image) == "PNG RGB 5x4"
    assert load_image(image).size == (5, 4)
    assert image_digest(image) == hashlib.sha256(png).hexdigest()
    assert image.name == f"data:image/png;base64 URI of {len(png)} bytes"


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("data:text/plain;base64,aGVsbG8=", "is not an image data: URI (text/plain)"),
        ("data:image/png,rawbytes", "is not base64-encoded"),
        ("data:image/png;base64,not*base64!", "its base64 does not decode"),
        ("data:image/png;base64,", "carries no bytes"),
        ("data:nonsense", "is not an image data: URI (no media type)"),
    ],
)
def test_a_data_uri_that_is_no_base64_image_is_refused(root, uri, says):
    refused = _refusal(uri, root)
    assert (
        refused.code == "bad_media_uri"
        and says in str(refused)
        and "Fix: give the image as data:image/" in str(refused)
    )


def test_a_png_is_described_decoded_to_rgb_and_hashed(root):
    image = resolve_image("images/red.png", root, WHERE)
    assert describe_image(image) == "PNG RGB 8x6"
    loaded = load_image(image)
    assert (loaded.mode, loaded.size, loaded.getpixel((0, 0))) == ("RGB", (8, 6), (200, 10, 10))
    assert image_digest(image) == hashlib.sha256((root / "images" / "red.png").read_bytes()).hexdigest()


def test_transparent_and_grey_images_become_rgb_with_transparency_over_white(root):
    (root / "clear.png").write_bytes(_png((4, 4), "RGBA", (0, 0, 0, 0)))
    (root / "grey.png").write_bytes(_png((4, 4), "L", (90,)))
    clear = load_image(resolve_image("clear.png", root, WHERE))
    assert describe_image(resolve_image("clear.png", root, WHERE)) == "PNG RGBA 4x4"
    assert (clear.mode, clear.getpixel((1, 1))) == ("RGB", (255, 255, 255))
    assert load_image(resolve_image("grey.png", root, WHERE)).getpixel((0, 0)) == (90, 90, 90)


def test_a_truncated_png_is_refused_naming_the_file_what_pillow_said_and_its_header(root):
    whole = _png((32, 32))
    (root / "cut.png").write_bytes(whole[: len(whole) // 2])
    image = resolve_image("cut.png", root, WHERE)
    assert describe_image(image) == "PNG RGB 32x32"  # the header is whole: only decoding finds the cut
    with pytest.raises(ImageRefused, match=r"bad_image: .*cut\.png cannot be decoded \(PNG RGB 32x32\): Pillow says"):
        load_image(image)


def test_a_text_file_named_png_is_refused_by_load_and_describe(root):
    (root / "notes.png").write_text("these are not pixels\n")
    image = resolve_image("notes.png", root, WHERE)
    with pytest.raises(ImageRefused) as caught:
        load_image(image)
    message = str(caught.value)
    assert message.startswith(f"{WHERE}: bad_image: {root.resolve() / 'notes.png'} cannot be decoded")
    assert "its format could not be identified" in message and "UnidentifiedImageError" in message
    assert "Fix: re-save the image as PNG or JPEG" in message
    with pytest.raises(ImageRefused, match="is not an image Pillow can read"):
        describe_image(image)


def test_an_image_ref_is_a_frozen_value():
    ref = ImageRef(source="a.png", path=Path("/r/a.png"), data=None, where=WHERE)
    with pytest.raises(AttributeError):
        ref.source = "b.png"  # type: ignore[misc]
    assert ref == ImageRef(source="a.png", path=Path("/r/a.png"), data=None, where=WHERE)


def test_input_output_media_tags_are_checked_by_the_same_rule(root, tmp_path):
    # An image-text run's parser: there an <img> reference is an image (a text-only run refuses every one).
    parser = LineParser(
        fmt="input_output", file=str(tmp_path / "d.jsonl"), media_root=str(root), image_placeholder="<image>"
    )

    def parsed(ref: str):
        return parser.parse(3, json.dumps({"input": f"<img>{ref}</img> what?", "output": "red"}).encode())

    png = base64.b64encode(_png()).decode()
    for ref in ("images/red.png", str(root / "images" / "red.png"), f"data:image/png;base64,{png}"):
        assert isinstance(parsed(ref), PromptCompletion), ref
    for ref, code in (
        ("http://x/y.png", "remote_media"),
        ("../y.png", "media_outside_root"),
        ("n.png", "missing_media"),
    ):
        rejected = parsed(ref)
        assert isinstance(rejected, Reject) and (rejected.line, rejected.code) == (3, code)
        assert rejected.reason == _refusal(ref, root).reason


def test_an_absolute_path_under_the_root_is_walked_like_a_relative_one(root, tmp_path):
    (root / "images" / "up").symlink_to(tmp_path)  # a link out of the root, then back in by name
    assert _refusal(str(root / "images" / "up" / "media" / "images" / "red.png"), root).code == "media_outside_root"
    assert _refusal(str(root / "images" / ".." / ".." / "secret.png"), root).code == "media_outside_root"
    assert _refusal(str(root), root).code == "media_not_file"
    # `..` after a symlink goes up from the link's target, as open() would, not from the link's name.
    (root / "images" / "deep").mkdir()
    (root / "jump").symlink_to("images/deep")
    assert resolve_image(str(root / "jump" / ".." / "red.png"), root, WHERE).path == (root / "images/red.png").resolve()
