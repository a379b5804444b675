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
        "preflight: no problems.\ntrain: 100%|#####| 2/2\nsaved LoRA adapter\nscan val: 7 rec\n"
    )
    assert not (tmp_path / "inner").exists()
    assert "before the run" in screen.getvalue() and "50%" in screen.getvalue()


def test_only_the_known_false_alarms_are_silenced():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        console.silence_known_false_alarms()
        warnings.warn(
            "Model has `tie_word_embeddings=True` and a tied layer is part of the adapter, but ...",
            UserWarning,
            stacklevel=1,
        )
        warnings.warn(
            "`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning, stacklevel=1
        )
        # Migrated, not silenced: seqtune calls activation_checkpointing_enable, so this would be a new caller's.
        warnings.warn(
            "`gradient_checkpointing_enable` is deprecated and will be removed in v6.", FutureWarning, stacklevel=1
        )
        warnings.warn(
            "`is_gradient_checkpointing` is deprecated", UserWarning, stacklevel=1
        )  # same text, other category
        warnings.warn("something else entirely", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == [
        "`gradient_checkpointing_enable` is deprecated and will be removed in v6.",
        "`is_gradient_checkpointing` is deprecated",
        "something else entirely",
    ]


def test_known_false_alarm_log_records_are_dropped_and_nothing_else(caplog):
    import logging

    console.silence_known_false_alarms()
    with caplog.at_level(logging.WARNING):
        logging.getLogger("torchao").warning("Skipping import of cpp extensions due to incompatible torch version")
        logging.getLogger("torchao").warning("a real torchao problem")
        logging.getLogger("transformers.modeling_utils").warning(
            "The new embeddings will be initialized from a multivariate normal distribution ..."
        )
    assert [r.getMessage() for r in caplog.records] == ["a real torchao problem"]


def test_gradient_checkpointing_is_enabled_without_the_deprecated_call():
    from seqtune.config.schema import ModelConfig
    from seqtune.models import build_model

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # gradient_checkpointing_enable would raise here
        model = build_model(ModelConfig(family="llama3", gradient_checkpointing=True), attn_implementation="sdpa")
    assert model.is_activation_checkpointing


def test_without_a_terminal_progress_is_plain_periodic_lines():
    screen = io.StringIO()  # not a TTY: a pipe, a file, a job log
    bar = console.progress_bar(total=20, initial=0, desc="train", unit="steps", enabled=True, stream=screen)
    for step in range(20):
        bar.set_postfix(loss=f"{1 / (step + 1):.4f}")
        bar.update(1)
    bar.close()
    lines = screen.getvalue().splitlines()
    assert "\r" not in screen.getvalue() and len(lines) == 10  # one line per tenth, none repeated at close
    assert lines[0] == "train: 2/20 steps (10%), loss=0.5000" and lines[-1].startswith("train: 20/20 steps (100%)")
    quiet = io.StringIO()
    console.progress_bar(total=5, initial=0, desc="train", unit="steps", enabled=False, stream=quiet).update(5)
    assert quiet.getvalue() == ""


def test_the_credentials_of_every_uri_in_a_text_are_redacted():
    text = (
        "MLflow at MLFLOW_TRACKING_URI=http://alice:s3cret@mlflow.example.com:5000/ failed; "
        "see https://TOKEN123@github.com/org/repo?ref=main&access_token=abc&X-Amz-Signature=f00 and file:///tmp/mlruns"
    )
    assert console.redact_uris(text) == (
        "MLflow at MLFLOW_TRACKING_URI=http://***@mlflow.example.com:5000/ failed; "
        "see https://***@github.com/org/repo?ref=main&access_token=***&X-Amz-Signature=*** and file:///tmp/mlruns"
    )
    plain = "a path /tmp/x@y, an address a@b.com, https://example.com/?q=1"
    assert console.redact_uris(plain) == plain
