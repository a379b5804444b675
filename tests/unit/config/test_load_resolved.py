"""A run's config.yaml is parsed and checked once per process (the worker, each export step and the export proof
read it): later reads are copies of the first, and a rewritten file is read again."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from seqtune.config import load as config_load
from seqtune.config.load import load_resolved, save_resolved
from tests.support.configs import make_cfg


def written(tmp_path: Path, *overrides: str) -> Path:
    path = tmp_path / "config.yaml"
    save_resolved(OmegaConf.structured(make_cfg(tmp_path, tmp_path / "train.jsonl", *overrides)), path)
    return path


def counting_reads(monkeypatch) -> list[Path]:
    reads: list[Path] = []
    read = config_load._read_resolved

    def counted(path: Path):
        reads.append(path)
        return read(path)

    monkeypatch.setattr(config_load, "_read_resolved", counted)
    return reads


def test_a_config_read_again_is_parsed_once_and_each_caller_gets_its_own_copy(tmp_path, monkeypatch):
    reads = counting_reads(monkeypatch)
    path = written(tmp_path, "train.max_steps=7")
    first, again = load_resolved(path), load_resolved(path)
    assert len(reads) == 1
    assert first == again and first is not again and first.train is not again.train
    first.train.max_steps = 99  # a caller changing its copy changes no other caller's
    assert load_resolved(path).train.max_steps == 7


def test_a_rewritten_config_is_read_again(tmp_path, monkeypatch):
    reads = counting_reads(monkeypatch)
    path = written(tmp_path, "train.max_steps=7")
    assert load_resolved(path).train.max_steps == 7
    written(tmp_path, "train.max_steps=8")  # save_resolved replaces the file whole (a new inode)
    assert load_resolved(path).train.max_steps == 8
    assert len(reads) == 2
