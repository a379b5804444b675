"""A record's image references: resolved under data.media_root, opened, described and hashed.

A reference is a path (relative to the media root, or absolute and under it), a `file:` URL of one, or a
`data:image/...;base64,...` URI carrying the bytes. A reference that leaves the root (`..`, an absolute path
elsewhere, a symlink out of it) is refused without looking at anything outside the root, so a dataset cannot use its
references to probe the machine's files; an http(s) URL is refused because seqtune never reads the network.

Every refusal is an `ImageRefused`: a DataError (exit 2) naming the record's file:line, the reference, the root and
the fix, whose `reason` ("<code>: <detail>; <fix>") is what the record parsers file a `Reject` under (the codes
below, seqtune.data.types.Reject). Torch-free; Pillow is imported only when an image is opened.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import unquote, urlsplit

from seqtune.config.errors import DataError

if TYPE_CHECKING:
    from PIL import Image

T = TypeVar("T")

# What resolve_image accepts, for the keys of caches whose records it decided (a change to the rule is a new cache):
# paths under the root (relative, or absolute under it), file: URLs of them, base64 image data: URIs; no URLs; a
# refused reference is looked at again when its cache is reused (seqtune.data.cache.images_changed).
MEDIA_REFERENCE_RULE = "media_under_root|absolute_under_root|file_url|data_uri_base64|no_remote|refused_rechecked"
# Symlinks followed while resolving one media reference (Linux's own limit), more is a loop.
MAX_SYMLINKS = 40
# A URL scheme with an authority (http://, https://, s3://, ftp://): a file elsewhere, never fetched.
_REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_DATA_URI = re.compile(r"^data:(?P<mime>[^;,]*)(?P<params>(;[^;,]*)*),(?P<payload>.*)$", re.DOTALL)
# Bytes hashed at a time by image_digest: a large image never sits in memory twice.
_DIGEST_CHUNK = 1 << 20


@dataclass(frozen=True)
class ImageRef:
    """One usable image reference: `source` as the record wrote it, and either `path` (a regular file under the
    media root, symlinks resolved) or `data` (a data: URI's decoded bytes). `where`: the record's file:line."""

    source: str
    path: Path | None
    data: bytes | None
    where: str

    @property
    def name(self) -> str:
        """How messages name the image: its path, or the data: URI's media type and size (never its payload)."""
        if self.path is not None:
            return str(self.path)
        return f"{self.source.split(',', 1)[0]} URI of {len(self.data or b'')} bytes"


class ImageRefused(DataError):
    """An image reference that cannot be used, or an image file that cannot be decoded (exit 2 before training)."""

    def __init__(self, code: str, detail: str, *, where: str, fix: str) -> None:
        self.code, self.detail, self.where = code, detail, where
        super().__init__(f"{where}: {code}: {detail}.", fix=fix)

    @property
    def reason(self) -> str:
        """The record parsers' reject reason (Reject.reason): the code, what is wrong and the fix, no location."""
        return f"{self.code}: {self.detail}; {self.fix}"


def resolve_under(root: str, ref: str) -> str | None:
    """`root/ref` with every symlink resolved (like os.path.realpath), or None when it leaves `root` (a real path,
    itself resolved): an absolute `ref`, a `..` above root, a symlink whose target lies outside. Walked one component
    at a time and stopped at the first step out, so nothing outside `root` is ever looked at (a dataset cannot use
    its media references to probe the machine's files)."""
    if os.path.isabs(ref):
        return None
    parts, current, links = ref.split("/"), root, 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if current == root:
                return None
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, part)
        if not os.path.islink(candidate):
            current = candidate
            continue
        links += 1
        target = os.readlink(candidate)
        if links > MAX_SYMLINKS:
            return None  # a symlink loop: nothing it names can be read
        if os.path.isabs(target):
            target = os.path.normpath(target)
            if target != root and not target.startswith(root + os.sep):
                return None
            current, target = root, os.path.relpath(target, root)
        parts = target.split("/") + parts
    return current


def resolve_image(ref: str, media_root: Path, where: str) -> ImageRef:
    """The image `ref` names, checked: a file under `media_root` or a data: URI's bytes. Raises ImageRefused."""
    ref = ref.strip()
    if not ref:
        raise ImageRefused(
            "empty_media", "an image reference with no path", where=where, fix="give the image file's path"
        )
    if ref.startswith("data:"):
        return ImageRef(source=ref, path=None, data=_data_uri_bytes(ref, where), where=where)
    if _REMOTE.match(ref) and not ref.lower().startswith("file:"):
        raise ImageRefused(
            "remote_media",
            f"{ref} is a URL; seqtune reads no network (training runs offline)",
            where=where,
            fix=f"download the image into {media_root} (data.media_root) and give its path relative to it",
        )
    root = os.path.realpath(media_root)
    path = resolve_under(root, _relative_to_root(_file_url_path(ref, where), media_root, root))
    if path is None:
        raise ImageRefused(
            "media_outside_root",
            f"{ref} resolves outside {root} (an absolute path, a '..' above it or a symlink out of it)",
            where=where,
            fix="media must lie under data.media_root: move the image under it, or set data.media_root to a "
            "directory that holds every image",
        )
    if not os.path.exists(path):
        raise ImageRefused(
            "missing_media",
            f"{ref} not found under {root}",
            where=where,
            fix="set data.media_root to the directory media paths are relative to, or correct the path",
        )
    if not os.path.isfile(path):
        kind = "a directory" if os.path.isdir(path) else "not a regular file"
        raise ImageRefused(
            "media_not_file",
            f"{ref} is {kind} under {root}, not a media file",
            where=where,
            fix="name the file itself (e.g. images/cat.png)",
        )
    return ImageRef(source=ref, path=Path(path), data=None, where=where)


def _file_url_path(ref: str, where: str) -> str:
    """A `file:` URL's path (percent-decoded); any other reference as it is."""
    if not ref.lower().startswith("file:"):
        return ref
    url = urlsplit(ref)
    if url.netloc not in ("", "localhost"):
        raise ImageRefused(
            "remote_media",
            f"{ref} names a file on host {url.netloc!r}",
            where=where,
            fix="copy the image under data.media_root and give its path (or file:///PATH on this machine)",
        )
    return unquote(url.path)


def _relative_to_root(path: str, media_root: Path, real_root: str) -> str:
    """An absolute path under the media root (as given, or with its symlinks resolved) made relative to it; any
    other absolute path stays absolute (resolve_under refuses it, looking at nothing). Only the root's prefix is
    removed: a `..` or a symlink after it is resolve_under's to follow, as the file system would."""
    if not os.path.isabs(path):
        return path
    for root in (os.path.normpath(os.path.abspath(media_root)), real_root):
        prefix = root.rstrip(os.sep) + os.sep
        if path == root or path.startswith(prefix):
            return path[len(prefix) :].lstrip(os.sep) or "."
    return path


def _data_uri_bytes(ref: str, where: str) -> bytes:
    shown = ref if len(ref) <= 60 else ref[:57] + "..."
    match = _DATA_URI.match(ref)
    fix = "give the image as data:image/<type>;base64,<base64 of the file>, or as a file under data.media_root"
    if match is None or not match["mime"].lower().startswith("image/"):
        mime = match["mime"] if match else "no media type"
        raise ImageRefused("bad_media_uri", f"{shown} is not an image data: URI ({mime})", where=where, fix=fix)
    if ";base64" not in match["params"].lower():
        raise ImageRefused("bad_media_uri", f"{shown} is not base64-encoded", where=where, fix=fix)
    try:
        data = base64.b64decode("".join(match["payload"].split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageRefused(
            "bad_media_uri", f"{shown}: its base64 does not decode ({exc})", where=where, fix=fix
        ) from None
    if not data:
        raise ImageRefused("bad_media_uri", f"{shown} carries no bytes", where=where, fix=fix)
    return data


def load_image(ref: ImageRef) -> Image.Image:
    """The image, fully decoded and in RGB (transparent pixels over white, as transformers' convert_to_rgb does,
    so what preflight decoded is what the processor sees). Raises ImageRefused naming the file and Pillow's error."""
    from PIL import Image

    found = "its format could not be identified"
    try:
        with _open(ref) as image:
            found = _described(image)
            image.load()  # Image.open reads only the header: a truncated or corrupt body fails here
            if image.mode == "RGB":
                return image.copy()
            rgba = image.convert("RGBA")
            return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    except _unreadable() as exc:
        raise ImageRefused(
            "bad_image",
            f"{ref.name} cannot be decoded ({found}): Pillow says {type(exc).__name__}: {exc}",
            where=ref.where,
            fix=BAD_IMAGE_FIX,
        ) from None


def describe_image(ref: ImageRef) -> str:
    """Format, mode and size from the image's header ("PNG RGB 64x64"), without decoding its pixels."""
    return _from_header(ref, _described)


def image_dimensions(ref: ImageRef) -> tuple[int, int]:
    """(width, height) from the image's header, without decoding its pixels (what a dynamic-resolution processor
    sizes the image's tokens by). Raises ImageRefused for a file Pillow cannot read."""
    return _from_header(ref, lambda image: (image.width, image.height))


def _from_header(ref: ImageRef, read: Callable[[Image.Image], T]) -> T:
    """`read` of the opened image (its header only, no pixels decoded); ImageRefused for a file Pillow cannot read."""
    try:
        with _open(ref) as image:
            return read(image)
    except _unreadable() as exc:
        raise ImageRefused(
            "bad_image",
            f"{ref.name} is not an image Pillow can read: {type(exc).__name__}: {exc}",
            where=ref.where,
            fix=BAD_IMAGE_FIX,
        ) from None


def image_digest(ref: ImageRef) -> str:
    """sha256 of the image's bytes (the file's, or the data: URI's), hex: a changed image is a new cache key."""
    digest = hashlib.sha256()
    if ref.data is not None:
        digest.update(ref.data)
        return digest.hexdigest()
    assert ref.path is not None, "an ImageRef holds a path or data"
    with open(ref.path, "rb") as file:
        while chunk := file.read(_DIGEST_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


BAD_IMAGE_FIX = "re-save the image as PNG or JPEG (RGB), or remove the record"


def _unreadable() -> tuple[type[BaseException], ...]:
    """What Pillow raises for a file it cannot read or decode (Pillow imported only when an image is opened)."""
    from PIL import Image

    return (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def _open(ref: ImageRef) -> Image.Image:
    from PIL import Image

    if ref.data is not None:
        return Image.open(io.BytesIO(ref.data))
    assert ref.path is not None, "an ImageRef holds a path or data"
    return Image.open(ref.path)


def _described(image: Image.Image) -> str:
    return f"{image.format or 'unknown format'} {image.mode} {image.width}x{image.height}"


def stored_image(stored: str) -> ImageRef:
    """An image as a token cache stores it (a sample's `images`: a path resolved under data.media_root when the
    scan checked it, or a data: URI) back as an ImageRef for load_image / image_digest."""
    if stored.startswith("data:"):
        return ImageRef(source=stored, path=None, data=_data_uri_bytes(stored, "the token cache"), where=stored[:5])
    return ImageRef(source=stored, path=Path(stored), data=None, where=stored)
