"""`python -m seqtune.export RUN_DIR` refuses (exit 2, naming RUN_DIR and the fix) a directory it cannot prove."""

from __future__ import annotations

from seqtune.export.__main__ import main


def test_a_directory_that_is_no_run_or_has_no_reference_is_refused(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert "is not a seqtune run directory (no config.yaml)" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("{}\n")
    assert main([str(tmp_path)]) == 2
    assert "export_reference.safetensors" in capsys.readouterr().err
