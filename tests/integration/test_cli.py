"""The real CLI end to end on tiny models (CPU): the embedded default, each family, the saved artifacts, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import REPO, read_metrics, run_cli
from tests.support.exports import assert_adapter_matches_merged

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

FAST = ["train.max_steps=6", "train.eval_every=3", "train.log_every=1", "train.batch_size=4"]


def _ok(result) -> None:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nSTDOUT:\n{result.stdout[-4000:]}\nSTDERR:\n{result.stderr[-4000:]}"
    )


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    """The embedded default, shortened: LoRA SFT of tiny TinyLlama on the shipped instruction data."""
    run_dir = tmp_path_factory.mktemp("default") / "run"
    _ok(run_cli([*FAST, "train.export_merged=true"], run_dir))
    return run_dir


def test_default_run_leaves_adapter_config_and_metrics(default_run: Path):
    assert (default_run / "adapter" / "adapter_model.safetensors").is_file()
    assert (default_run / "adapter" / "adapter_config.json").is_file()
    resolved = (default_run / "config.yaml").read_text()
    assert "recipe_name: sft" in resolved and "${" not in resolved  # fully resolved
    # The default model is tinyllama_tiny: this run is that family's run through the CLI (the other families'
    # are test_each_family_trains_through_the_cli's).
    assert "family: tinyllama" in resolved
    metrics = read_metrics(default_run)
    steps = [m["step"] for m in metrics if "loss" in m]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert all(m["loss"] > 0 and m["tokens_per_s"] > 0 for m in metrics if "loss" in m)
    evals = [m for m in metrics if "eval_loss" in m]
    assert [m["step"] for m in evals] == [3, 6] and all(m["eval_ppl"] > 1 for m in evals)
    report = json.loads((default_run / "preflight.json").read_text())
    assert report["ok"] is True and isinstance(report["max_seq_len"], int)


def test_saved_adapter_reloads_with_peft_and_matches_merged_export(default_run: Path):
    assert_adapter_matches_merged(default_run, seq=24)


# tinyllama_tiny, the default model, trains in default_run (above), longer and with more checks.
@pytest.mark.parametrize("model", ["llama3_tiny", "gemma3_tiny", "mistral_tiny"])
def test_each_family_trains_through_the_cli(model: str, tmp_path: Path):
    run_dir = tmp_path / "run"
    _ok(run_cli([f"model={model}", "train.max_steps=3", "train.eval_every=0", "train.batch_size=4"], run_dir))
    assert len([m for m in read_metrics(run_dir) if "loss" in m]) >= 1
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()


def test_full_sft_recipe_trains(tmp_path: Path):
    run_dir = tmp_path / "run"
    _ok(run_cli(["recipe=full_sft", "train.max_steps=3", "train.eval_every=0", "train.batch_size=4"], run_dir))
    assert (run_dir / "model" / "model.safetensors").is_file()


def test_tiny_model_overfits_a_handful_of_samples(tmp_path: Path):
    data = tmp_path / "few.jsonl"
    rows = [
        {"instruction": f"Repeat the word {w}.", "input": "", "output": f"{w} {w} {w}"}
        for w in ("apple", "river", "candle", "orbit")
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = tmp_path / "run"
    _ok(
        run_cli(
            [
                f"data.train={data}",
                "data.val=null",
                "train.max_steps=40",
                "train.batch_size=4",
                "train.eval_every=0",
                "optim.lr=1e-2",
                "optim.warmup_steps=0",
                "lora.rank=16",
            ],
            run_dir,
        )
    )
    losses = [m["loss"] for m in read_metrics(run_dir) if "loss" in m]
    assert losses[-1] < 0.35 * losses[0], losses


def test_wrong_key_is_named(tmp_path: Path):
    result = run_cli(["model.hiden_size=32"], tmp_path / "run")
    assert result.returncode != 0
    assert "hiden_size" in result.stderr


def test_missing_model_path_names_the_key_and_fix(tmp_path: Path):
    result = run_cli(["model=llama3_8b"], tmp_path / "run")
    assert result.returncode != 0
    assert "model.path" in result.stderr and "Fix: model.path=" in result.stderr


def test_wrong_model_path_names_the_key_and_what_was_expected(tmp_path: Path):
    result = run_cli(["model=llama3_8b", "lora=default", f"model.path={tmp_path / 'nowhere'}"], tmp_path / "run")
    assert result.returncode == 2, result.stderr
    assert "model.path" in result.stdout + result.stderr and "config.json" in result.stdout + result.stderr


def test_a_local_checkpoint_directory_trains_through_a_real_size_config(tmp_path: Path):
    """What a real user does: model=<real config> model.path=DIR, with the tokenizer taken from DIR."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from seqtune.config.schema import ModelConfig
    from seqtune.models import build_model
    from seqtune.tokenizers import BUNDLED_DIR

    tiny = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(ModelConfig), OmegaConf.load(REPO / "seqtune/configs/model/tinyllama_tiny.yaml")
        )
    )
    checkpoint = tmp_path / "TinyLlama-local"
    model, tokenizer = build_model(tiny, attn_implementation="sdpa"), AutoTokenizer.from_pretrained(BUNDLED_DIR)
    # A real checkpoint states its tokenizer's bos/eos ids (preflight checks them, and generation stops on eos).
    for config in (model.config, model.generation_config):
        config.bos_token_id, config.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    model.save_pretrained(checkpoint, safe_serialization=True)
    tokenizer.save_pretrained(checkpoint)
    run_dir = tmp_path / "run"
    _ok(
        run_cli(
            [
                "model=tinyllama_1b",
                f"model.path={checkpoint}",
                "lora=default",
                "train.max_steps=2",
                "train.eval_every=0",
                "train.batch_size=4",
            ],
            run_dir,
        )
    )
    adapter = json.loads((run_dir / "adapter" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(checkpoint)
    assert json.loads((run_dir / "preflight.json").read_text())["vocab"]["embedding_rows"] == 4096


def test_the_tiny_lora_preset_is_refused_for_a_real_checkpoint(tmp_path: Path):
    result = run_cli(["model=llama3_8b", f"model.path={tmp_path}"], tmp_path / "run")
    assert result.returncode == 2  # a refusal before training, like every other
    assert "lora=tiny" in result.stderr and "Fix: lora=default" in result.stderr


def test_unknown_recipe_lists_the_available_ones(tmp_path: Path):
    result = run_cli(["recipe=nope"], tmp_path / "run")
    assert result.returncode != 0
    assert "recipe/nope" in result.stderr and "lora_sft" in result.stderr and "full_sft" in result.stderr


def test_preflight_only_is_a_dry_run(tmp_path: Path):
    run_dir = tmp_path / "run"
    result = run_cli(["preflight.only=true"], run_dir)
    _ok(result)
    assert json.loads((run_dir / "preflight.json").read_text())["ok"] is True
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "adapter").exists()


def test_wandb_logger_runs_offline_without_a_key(tmp_path: Path):
    run_dir = tmp_path / "run"
    _ok(
        run_cli(
            ["logger=wandb", "train.max_steps=2", "train.eval_every=0", "train.batch_size=4"],
            run_dir,
            env={"WANDB_API_KEY": ""},
        )
    )
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert offline, "no offline W&B run directory"
    assert list(offline[0].glob("*.wandb")), "the offline run recorded no data"
    # Offline runs keep everything in the .wandb record file: metrics, the preflight summary, the histogram.
    records = next(offline[0].glob("*.wandb")).read_bytes()
    for key in (b"grad_norm", b"tokens_per_s", b"preflight/max_seq_len", b"preflight/train/records", b"recipe_name"):
        assert key in records, key
    assert list((offline[0] / "files" / "media" / "images").rglob("*.png")), "length histogram not logged"
    # preflight's shown samples as a table: targets marked, file:line per row.
    [table] = list((offline[0] / "files" / "media" / "table").rglob("*.table.json"))
    assert b"preflight/samples" in records
    rows = json.loads(table.read_text())
    assert rows["columns"] == ["split", "why", "location", "tokens", "targets", "text"]
    assert rows["data"][0][0] == "train" and "instruct/train.jsonl:" in rows["data"][0][2]
    assert "\u27e6" in rows["data"][0][5]


def test_wandb_unreachable_with_a_key_finishes_offline_and_never_writes_the_key(tmp_path: Path):
    """A key and no network (W&B's host is a closed local port): the start-up gives up after logger.wandb.init_timeout,
    the run logs offline into the run directory and says how to sync it; the key is in no file seqtune writes."""
    run_dir = tmp_path / "run"
    secret = "0123456789abcdef0123456789abcdef0123beef"
    result = run_cli(
        [
            "logger=wandb",
            "logger.wandb.init_timeout=2",
            "train.max_steps=1",
            "train.eval_every=0",
            "train.batch_size=4",
        ],
        run_dir,
        env={"WANDB_API_KEY": secret, "WANDB_BASE_URL": "http://127.0.0.1:9"},
    )
    _ok(result)
    [offline] = list((run_dir / "wandb").glob("offline-run-*"))
    assert "W&B could not be reached within logger.wandb.init_timeout=2s" in result.stdout
    assert f"wandb sync {offline}" in result.stdout
    assert (run_dir / "finished.json").is_file()
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"the W&B key leaked into {path}"


def test_cfg_job_prints_the_composed_config_and_trains_nothing(tmp_path: Path):
    result = run_cli(["--cfg", "job", "model=gemma3_tiny", "lora.rank=4"], tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert "family: gemma3" in result.stdout and "rank: 4" in result.stdout and "recipe_name: sft" in result.stdout
    assert not (tmp_path / "run" / "preflight.json").exists()
