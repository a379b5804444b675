"""llama.cpp loads here from the prebuilt wheel: on a glibc older than 2.38 through the relinked copy, whose only
change is the four C23 imports and the weak GLIBC_2.38 requirement."""

from __future__ import annotations

import os
import platform
import struct
from pathlib import Path

from seqtune import llama_cpp


def shipped() -> Path:
    from llama_cpp_py_sync import _cffi_bindings

    return Path(_cffi_bindings.__file__).parent


def undefined_imports(data: bytearray) -> list[tuple[bytes, int]]:
    """(name, version index) of each undefined dynamic symbol."""
    sections = llama_cpp._sections(data)
    dynsym = next(s for s in sections if s[0] == llama_cpp._SHT_DYNSYM)
    versym = next(s for s in sections if s[0] == llama_cpp._SHT_VERSYM)[1]
    strings = sections[dynsym[3]][1]
    found = []
    for index in range(1, dynsym[2] // 24):
        name, _info, _other, section = struct.unpack_from("<IBBH", data, dynsym[1] + index * 24)
        if section == 0:
            (version,) = struct.unpack_from("<H", data, versym + 2 * index)
            found.append((llama_cpp._string(data, strings + name), version))
    return found


def test_relinking_renames_only_the_c23_imports():
    original = bytearray((shipped() / "libllama.so.0").read_bytes())
    relinked = bytearray(original)
    assert llama_cpp._relink_c23(relinked) == 4
    before, after = undefined_imports(original), undefined_imports(relinked)
    changed = {old[0]: new for old, new in zip(before, after, strict=True) if old != new}
    assert set(changed) == {b"__isoc23_sscanf", b"__isoc23_strtol", b"__isoc23_strtoul", b"__isoc23_strtoull"}
    baseline = llama_cpp._libc_versions(relinked, _verneed(relinked), _strings(relinked))[llama_cpp._GLIBC_BASE][1]
    assert all(new == (old[len(b"__isoc23_") :], baseline) for old, new in changed.items())
    versions = llama_cpp._libc_versions(relinked, _verneed(relinked), _strings(relinked))
    (flags,) = struct.unpack_from("<H", relinked, versions[llama_cpp._GLIBC_C23][0] + 4)
    assert flags & llama_cpp._VER_FLG_WEAK
    assert len(relinked) == len(original)


def _verneed(data):
    return next(s for s in llama_cpp._sections(data) if s[0] == llama_cpp._SHT_VERNEED)


def _strings(data):
    sections = llama_cpp._sections(data)
    return sections[next(s for s in sections if s[0] == llama_cpp._SHT_DYNSYM)[3]][1]


def test_llama_cpp_loads_and_states_its_build():
    glibc = tuple(int(part) for part in platform.libc_ver()[1].split("."))
    assert llama_cpp.missing_reason() is None, (glibc, os.uname().machine)
    assert llama_cpp.version() == "llama-cpp-py-sync 0.11739 (llama.cpp b11739)"
