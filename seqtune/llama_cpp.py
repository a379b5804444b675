"""llama.cpp itself, in process: the one place seqtune reaches it (quantizing a GGUF file, and running one to prove
it). Through `llama-cpp-py-sync` (dev extra, pinned in constraints.txt): a 5.5 MB wheel carrying llama.cpp's own
prebuilt shared libraries (libllama, libggml*, CPU build: AVX2, no AVX-512 needed) and CFFI declarations of its C
API; nothing is compiled.

The wheel is tagged manylinux2014 but its libraries were linked against glibc 2.38 for four functions only:
`__isoc23_sscanf/strtol/strtoul/strtoull`, C23's variants that also read a "0b" prefix (glibc >= 2.38 redirects
them from the C library's own names). On an older glibc (Debian 12 has 2.36) the loader refuses the libraries
("version `GLIBC_2.38' not found"). `_loadable_copy` then writes, once, a copy of them under
$SEQTUNE_CACHE/llama_cpp/<version>/ (~/.cache/seqtune by default) whose four imports name the classic functions (their symbol's name is a suffix
of the C23 one: the name's string offset moves by 9 bytes) at the C library's baseline version, and whose
GLIBC_2.38 requirement is marked weak (ELF VER_FLG_WEAK: a missing weak version is not an error). llama.cpp never
parses binary literals, so the classic functions read every number it reads the same.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from seqtune.config.errors import SeqtuneError

PACKAGE = "llama-cpp-py-sync"
# llama.cpp's quantization types seqtune writes through llama.cpp (its LLAMA_FTYPE_MOSTLY_* values, llama.h).
FTYPES = {"q4_k_m": 15, "q5_k_m": 17, "q6_k": 18, "q8_0": 7}
_C23 = b"__isoc23_"
_GLIBC_BASE, _GLIBC_C23 = b"GLIBC_2.2.5", b"GLIBC_2.38"
_VER_FLG_WEAK = 0x2
_SHT_DYNSYM, _SHT_VERNEED, _SHT_VERSYM = 11, 0x6FFFFFFE, 0x6FFFFFFF


class LlamaCppUnavailable(SeqtuneError):
    """llama.cpp cannot be loaded here (the package is missing, or its libraries do not load)."""


def missing_reason() -> str | None:
    """Why llama.cpp cannot run here, or None."""
    try:
        _library()
    except LlamaCppUnavailable as exc:
        return str(exc)
    return None


@cache
def _library() -> tuple[Any, Any, Any]:
    """(cffi ffi, the loaded libllama, its log callback), its backends initialised and its log silenced."""
    try:
        from llama_cpp_py_sync import _cffi_bindings, _version
    except ImportError:
        raise LlamaCppUnavailable(
            f"llama.cpp is not installed (the {PACKAGE} package). Fix: pip install -c constraints.txt {PACKAGE} "
            "(the dev extra has it)."
        ) from None
    ffi, shipped = _cffi_bindings.ffi, Path(_cffi_bindings.__file__).parent
    try:
        lib = ffi.dlopen(str(shipped / "libllama.so.0"))
    except OSError as exc:
        if _GLIBC_C23.decode() not in str(exc):
            raise LlamaCppUnavailable(f"llama.cpp's library does not load: {exc}") from None
        copy = _loadable_copy(shipped, _version.__version__)
        try:
            lib = ffi.dlopen(str(copy / "libllama.so.0"))
        except OSError as again:
            raise LlamaCppUnavailable(f"llama.cpp's library does not load, even relinked: {again}") from None
    # llama.cpp's log goes nowhere: its load report and per-tensor quantize lines say nothing a user acts on; a
    # failure comes back as a NULL model or a non-zero status, which the callers name. The callback must outlive
    # every call into the library: it is cached with it.
    quiet = ffi.callback("ggml_log_callback", lambda level, text, user_data: None)
    lib.llama_log_set(quiet, ffi.NULL)
    lib.llama_backend_init()
    return ffi, lib, quiet


def _loadable_copy(shipped: Path, version: str) -> Path:
    """The package's libraries relinked for glibc < 2.38 (module docstring), written once per version."""
    from seqtune.tokenizers.pypi import cache_root

    target = cache_root() / "llama_cpp" / version
    done = target / ".complete"
    if done.is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    for library in sorted(shipped.glob("lib*.so*")):
        data = bytearray(library.read_bytes())
        _relink_c23(data)
        partial = target / f".{library.name}.{os.getpid()}.partial"  # two processes may relink at once
        partial.write_bytes(data)
        partial.chmod(0o755)
        partial.replace(target / library.name)
    done.write_text(version)
    return target


def _relink_c23(data: bytearray) -> int:
    """In one ELF64 shared library: each undefined __isoc23_X import becomes X at GLIBC_2.2.5, and the GLIBC_2.38
    requirement turns weak. Returns the number of imports renamed."""
    sections = _sections(data)
    dynsym = next(s for s in sections if s[0] == _SHT_DYNSYM)
    strings = sections[dynsym[3]][1]
    libc = _libc_versions(data, next(s for s in sections if s[0] == _SHT_VERNEED), strings)
    versym = next(s for s in sections if s[0] == _SHT_VERSYM)[1]
    renamed = 0
    for index in range(dynsym[2] // 24):
        symbol = dynsym[1] + index * 24
        name_offset, _info, _other, section = struct.unpack_from("<IBBH", data, symbol)
        if section == 0 and _string(data, strings + name_offset).startswith(_C23):
            struct.pack_into("<I", data, symbol, name_offset + len(_C23))
            struct.pack_into("<H", data, versym + 2 * index, libc[_GLIBC_BASE][1])
            renamed += 1
    if _GLIBC_C23 in libc:
        entry = libc[_GLIBC_C23][0]
        (flags,) = struct.unpack_from("<H", data, entry + 4)
        struct.pack_into("<H", data, entry + 4, flags | _VER_FLG_WEAK)
    return renamed


def _sections(data: bytearray) -> list[tuple[int, int, int, int]]:
    """(type, file offset, size, link) of each section header."""
    (table,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count = struct.unpack_from("<HH", data, 0x3A)
    headers = (struct.unpack_from("<IIQQQQIIQQ", data, table + i * entry_size) for i in range(count))
    return [(kind, offset, size, link) for _name, kind, _f, _a, offset, size, link, *_rest in headers]


def _libc_versions(data: bytearray, verneed: tuple[int, int, int, int], strings: int) -> dict[bytes, tuple[int, int]]:
    """libc.so.6's required versions: name -> (its Vernaux entry's offset, its version index)."""
    found, offset = {}, verneed[1]
    while True:
        _version, count, file, aux, following = struct.unpack_from("<HHIII", data, offset)
        entry = offset + aux
        for _ in range(count):
            _hash, _flags, index, name, step = struct.unpack_from("<IHHII", data, entry)
            if _string(data, strings + file) == b"libc.so.6":
                found[_string(data, strings + name)] = (entry, index)
            entry += step
        if not following:
            return found
        offset += following


def _string(data: bytearray, offset: int) -> bytes:
    return bytes(data[offset : data.index(b"\0", offset)])


def version() -> str:
    """The package's version and the llama.cpp build it carries."""
    from llama_cpp_py_sync import _version

    return f"{PACKAGE} {_version.__version__} (llama.cpp {_version.__llama_cpp_tag__})"


def quantize(source: Path, target: Path, gguf_type: str) -> None:
    """llama.cpp's own quantizer (llama-quantize's library call) from an f16 GGUF file to `gguf_type`."""
    ffi, lib, _ = _library()
    params = ffi.new("llama_model_quantize_params *", lib.llama_model_quantize_default_params())
    params.ftype = FTYPES[gguf_type]
    params.nthread = max(1, min(4, os.cpu_count() or 1))
    status = lib.llama_model_quantize(str(source).encode(), str(target).encode(), params)
    if status != 0:
        raise SeqtuneError(f"llama.cpp could not quantize {source} to {gguf_type} (status {status})")


class LlamaModel:
    """A GGUF file loaded by llama.cpp (with a LoRA adapter GGUF applied at scale 1, when given), one context."""

    def __init__(self, path: Path, *, adapter: Path | None = None, n_ctx: int = 1024) -> None:
        ffi, lib, _quiet = _library()
        self._ffi, self._lib = ffi, lib
        self._adapter = ffi.NULL
        self._model = lib.llama_model_load_from_file(str(path).encode(), lib.llama_model_default_params())
        if self._model == ffi.NULL:
            raise SeqtuneError(f"llama.cpp cannot load {path}")
        if adapter is not None:
            self._adapter = lib.llama_adapter_lora_init(self._model, str(adapter).encode())
            if self._adapter == ffi.NULL:
                self.close()
                raise SeqtuneError(f"llama.cpp cannot apply the adapter {adapter} to {path}")
        params = lib.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
        params.n_threads = params.n_threads_batch = max(1, min(4, os.cpu_count() or 1))
        self._ctx = lib.llama_init_from_model(self._model, params)
        if self._ctx == ffi.NULL:
            self.close()
            raise SeqtuneError(f"llama.cpp cannot make a context for {path}")
        if adapter is not None:
            adapters = ffi.new("struct llama_adapter_lora *[1]", [self._adapter])
            scales = ffi.new("float[1]", [1.0])
            if lib.llama_set_adapters_lora(self._ctx, adapters, 1, scales) != 0:
                self.close()
                raise SeqtuneError(f"llama.cpp cannot apply the adapter {adapter}")
        self._vocab = lib.llama_model_get_vocab(self._model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self.n_ctx = n_ctx

    def __enter__(self) -> LlamaModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        ffi, lib = self._ffi, self._lib
        if getattr(self, "_ctx", ffi.NULL) != ffi.NULL:
            lib.llama_free(self._ctx)
            self._ctx = ffi.NULL
        if self._adapter != ffi.NULL:
            lib.llama_adapter_lora_free(self._adapter)
            self._adapter = ffi.NULL
        if self._model != ffi.NULL:
            lib.llama_model_free(self._model)
            self._model = ffi.NULL

    def tokenize(self, text: str) -> list[int]:
        """`text`'s ids as llama.cpp's tokenizer reads it: special tokens parsed, none added (the rendered chat
        template carries its own)."""
        raw = text.encode("utf-8")
        room = len(raw) + 16
        ids = self._ffi.new(f"llama_token[{room}]")
        count = self._lib.llama_tokenize(self._vocab, raw, len(raw), ids, room, False, True)
        if count < 0:
            raise SeqtuneError(f"llama.cpp's tokenizer failed on a {len(raw)}-byte text ({count})")
        return [int(ids[i]) for i in range(count)]

    def next_logits(self, ids: list[int]) -> np.ndarray:
        """The next-token logits after `ids`, from an empty context (float32, one per vocabulary entry)."""
        self._lib.llama_memory_clear(self._lib.llama_get_memory(self._ctx), True)
        return self._decode(ids)

    def next_after(self, token: int) -> np.ndarray:
        """The next-token logits after `token` is appended to what the context holds (the previous call's ids)."""
        return self._decode([token])

    def _decode(self, ids: list[int]) -> np.ndarray:
        if not ids or len(ids) > self.n_ctx:
            raise SeqtuneError(f"llama.cpp context holds 1..{self.n_ctx} tokens, asked for {len(ids)}")
        tokens = self._ffi.new("llama_token[]", ids)
        status = self._lib.llama_decode(self._ctx, self._lib.llama_batch_get_one(tokens, len(ids)))
        if status != 0:
            raise SeqtuneError(f"llama.cpp could not decode {len(ids)} tokens (status {status})")
        row = self._lib.llama_get_logits_ith(self._ctx, -1)
        return np.frombuffer(self._ffi.buffer(row, 4 * self.n_vocab), dtype=np.float32).copy()

    def is_end(self, token: int) -> bool:
        """Whether llama.cpp's generation ends at `token` (an end-of-generation id of the file's vocabulary)."""
        return bool(self._lib.llama_vocab_is_eog(self._vocab, token))

    def end_ids(self) -> set[int]:
        return {token for token in range(self.n_vocab) if self.is_end(token)}

    def greedy(self, ids: list[int], max_new: int, stop: Iterable[int]) -> list[int]:
        """Greedy continuation of `ids`: up to `max_new` tokens, ending with (and including) the first stop id."""
        stops, produced = set(stop), []
        logits = self.next_logits(ids)
        for _ in range(max_new):
            token = int(np.argmax(logits))
            produced.append(token)
            if token in stops or len(ids) + len(produced) >= self.n_ctx:
                break
            logits = self._decode([token])
        return produced
