"""seqtune.console: the run's log file mirrors the console; only the listed false alarms are silenced."""

from __future__ import annotations

import io
import sys
import warnings

from seqtune import console


def test_run_log_keeps_what_the_console_showed_with_bars_in_their_final_state(tmp_path, monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", screen)
    console.install_tee()
    print("before the run: console only")
    with console.run_log(tmp_path):
        print("preflight: no problems.")
        sys.stderr.write("\rtrain:  50%|#    | 1/2\rtrain: 100%|#####| 2/2\n")
        with console.run_log(tmp_path / "inner"):  # launcher=local: the worker inside the parent's run
            print("saved LoRA adapter")
        sys.stderr.write("\rscan val: 7 rec")  # a bar left unfinished
    print("after the run: console only")
    assert (tmp_path / console.LOG_FILE).read_text() == (
        "preflight: no problems.\ntrain: 100%|#####| 2/2\nsaved LoRA adapter\nscan val: 7 rec\n")
    assert not (tmp_path / "inner").exists()
    assert "before the run" in screen.getvalue() and "50%" in screen.getvalue()


def test_only_the_known_false_alarms_are_silenced():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        console.silence_known_false_alarms()
        warnings.warn("Model has `tie_word_embeddings=True` and a tied layer is part of the adapter, but ...",
                      UserWarning)
        warnings.warn("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning)
        warnings.warn("`gradient_checkpointing_enable` is deprecated and will be removed in v6.", FutureWarning)
        warnings.warn("`is_gradient_checkpointing` is deprecated", UserWarning)  # same text, other category
        warnings.warn("something else entirely", UserWarning)
    assert [str(w.message) for w in caught] == ["`is_gradient_checkpointing` is deprecated", "something else entirely"]
