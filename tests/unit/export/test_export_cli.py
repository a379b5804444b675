"""`python -m seqtune.export RUN_DIR` refuses (exit 2, naming RUN_DIR and the fix) a directory it cannot prove."""

from __future__ import annotations

import pytest

from seqtune.export.__main__ import main


def test_a_directory_that_is_no_run_or_has_no_reference_is_refused(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "is not a seqtune run directory (no config.yaml)" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("{}\n")
    assert main([str(tmp_path)]) == 2
    assert "export_reference.safetensors" in capsys.readouterr().err


def test_a_push_that_cannot_work_is_refused_before_the_proof(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    (tmp_path / "config.yaml").write_text("{}\n")  # no reference logits: the proof would exit 2 naming them
    assert main([str(tmp_path), "--push", "org--name"]) == 2
    err = capsys.readouterr().err
    assert "--push=org--name is not a Hub repository id" in err and "export_reference" not in err


def test_public_is_a_setting_of_push(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main([str(tmp_path), "--public"])
    assert exited.value.code == 2 and "--public is a setting of --push ORG/NAME" in capsys.readouterr().err
