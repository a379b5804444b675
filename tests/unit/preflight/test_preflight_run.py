"""run_preflight end to end on small JSONL files, the bundled tokenizer and a tiny model config (CPU, seconds).

One test (pair) per field report in /work/shared/ORIGINS.md: each fails the way the report did, with a message
that names the key and the fix, and passes once the fix is applied.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seqtune.config.plan import load_plan
from seqtune.config.schema import PaddingStrategy
from seqtune.preflight import load_result, run_preflight
from tests.support.configs import TINY_MODEL, alpaca, compose_real, make_cfg, messages, run_failing
from tests.support.data import write_jsonl

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture()
def varied(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "train.jsonl", [alpaca(n, i) for i, n in enumerate([1, 3, 7, 20, 2, 9, 15, 4])])


# --- report 1: variable-length samples, batch > 1 --------------------------------------------------------------


def test_variable_lengths_pass_with_default_longest_padding(tmp_path, varied, capsys):
    cfg = make_cfg(tmp_path, varied, "preflight.plot=true")
    result = run_preflight(cfg, tmp_path / "run")
    report = json.loads((tmp_path / "run" / "preflight.json").read_text())
    assert result.ok and report["ok"] and report["problems"] == []
    lengths = report["splits"]["train"]["lengths"]
    assert lengths["min"] < lengths["max"] and report["max_seq_len"] == -(-lengths["max"] // 8) * 8
    assert report["padding"]["strategy"] == "longest" and 0 < report["padding"]["efficiency"] <= 1
    assert report["plan"]["splits"]["train"]["micro_batches_per_rank"] == 2
    assert Path(report["caches"]["train"]).is_dir() and (tmp_path / "run" / "lengths.png").is_file()
    assert load_result(tmp_path / "run") == result
    assert "preflight: no problems." in capsys.readouterr().out


# --- report 2: fixed shapes and pre-padded input -----------------------------------------------------------------


def test_max_length_strategy_gives_fixed_shapes(tmp_path, varied):
    result = run_preflight(
        make_cfg(tmp_path, varied, "padding.strategy=max_length", "data.max_seq_len=64"), tmp_path / "run"
    )
    assert result.ok and result.max_seq_len == 64 and result.padding.strategy == "max_length"
    assert result.padding.efficiency < 0.5  # fixed shapes cost padding, and the report says how much


def test_inconsistently_prepadded_tokenized_rows_are_detected(tmp_path):
    # Report 2: rows padded to the longest of their map batch, so two widths (12 and 9) arrive.
    rows = []
    for real, width in [(5, 12), (8, 12), (4, 9), (6, 9)]:
        ids = list(range(10, 10 + real))
        rows.append({"input_ids": ids + [0] * (width - real), "attention_mask": [1] * real + [0] * (width - real)})
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    result = run_preflight(
        make_cfg(tmp_path, train, "data.format=tokenized", "padding.strategy=max_length", "data.max_seq_len=16"),
        tmp_path / "run",
    )
    assert result.splits["train"].prepadded == 4
    assert any("arrived already padded" in note for note in result.notes)
    broken = write_jsonl(tmp_path / "broken.jsonl", rows + [{"input_ids": [5, 6, 7], "attention_mask": [1, 1]}])
    report = run_failing(
        make_cfg(tmp_path, broken, "data.format=tokenized", "data.max_seq_len=16"),
        tmp_path / "run2",
        match=r"data.max_bad_fraction \(.*broken.jsonl:5\)",
    )
    assert "broken.jsonl:5 (wrong_type: lengths differ" in messages(report)


# --- report 3: malformed lines and missing media -----------------------------------------------------------------


def test_bad_lines_go_to_rejects_and_fail_at_zero_fraction(tmp_path):
    (tmp_path / "cat.png").write_bytes(b"\x89PNG")
    good = [{"input": f"Describe a cat {i}", "output": "a cat"} for i in range(8)]
    # An <img> reference on a text model is a bad line whether its file exists or not (it would train as text).
    train = write_jsonl(
        tmp_path / "train.jsonl", good + ['{"input": "cut', {"input": "<img>cat.png</img>", "output": "x"}]
    )
    report = run_failing(
        make_cfg(tmp_path, train, "data.format=input_output"), tmp_path / "run", match="data.max_bad_fraction"
    )
    rejects = [json.loads(line) for line in (tmp_path / "run" / "rejects.jsonl").read_text().splitlines()]
    assert [(Path(r["file"]).name, r["line"], r["reason"].split(":")[0]) for r in rejects] == [
        ("train.jsonl", 9, "bad_json"),
        ("train.jsonl", 10, "unsupported_content"),
    ]
    assert report["splits"]["train"]["rejected"] == 2 and report["problems"][0]["key"] == "data.max_bad_fraction"
    result = run_preflight(
        make_cfg(tmp_path, train, "data.format=input_output", "data.max_bad_fraction=0.25"), tmp_path / "run2"
    )
    assert result.ok and result.splits["train"].records == 10 and result.splits["train"].rejected == 2


# --- report 4: tokenizer bigger than the model's vocabulary ------------------------------------------------------


def tokenizer_without_pad(tmp_path: Path) -> Path:
    """The bundled tokenizer saved without a pad token, so tokenizer.pad_policy=add appends one (id 4096)."""
    from transformers import AutoTokenizer

    from seqtune.tokenizers import BUNDLED_DIR

    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_DIR)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path / "no-pad")
    return tmp_path / "no-pad"


def test_tokenizer_bigger_than_embedding_fails_until_resized(tmp_path, varied):
    no_pad = tokenizer_without_pad(tmp_path)
    added = ("tokenizer.source=path", f"tokenizer.path={no_pad}", "tokenizer.pad_policy=add")
    cfg = make_cfg(tmp_path, varied, *added)
    report = run_failing(cfg, tmp_path / "run", match=r"model\.resize_embeddings")
    assert report["vocab"]["tokenizer_size"] == report["vocab"]["embedding_rows"] + 1
    assert "4097" in report["problems"][0]["message"] and "4096" in report["problems"][0]["message"]
    result = run_preflight(make_cfg(tmp_path, varied, *added, "model.resize_embeddings=true"), tmp_path / "run2")
    assert result.ok and result.vocab.resized_to == 4160


# --- report 5: a validation sample longer than every training sample ---------------------------------------------


def test_explicit_limit_from_train_fails_on_longer_val_and_auto_covers_all_splits(tmp_path, varied):
    train_only = run_preflight(make_cfg(tmp_path, varied), tmp_path / "probe")
    longest_train = train_only.splits["train"].lengths["max"]
    val = write_jsonl(tmp_path / "val.jsonl", [alpaca(2), alpaca(40), alpaca(3)])
    cfg = make_cfg(tmp_path, varied, f"data.val={val}", f"data.max_seq_len={longest_train}")
    report = run_failing(cfg, tmp_path / "run", match=r"data.max_seq_len \(.*val.jsonl:2\)")
    problem = report["problems"][0]
    assert problem["message"].startswith(f"data.max_seq_len={longest_train} < longest val sample ")
    assert problem["location"].endswith("val.jsonl:2") and "data.max_seq_len=auto" in problem["message"]
    result = run_preflight(make_cfg(tmp_path, varied, f"data.val={val}"), tmp_path / "run2")
    assert result.ok and result.max_seq_len >= result.splits["val"].lengths["max"] > longest_train


# --- the fast checks -----------------------------------------------------------------------------------------------


def test_lora_typo_and_context_overflow_print_before_the_scan(tmp_path, varied, capsys):
    cfg = make_cfg(tmp_path, varied, "lora.target_modules=[q_proj,query]", "data.max_seq_len=4096")
    report = run_failing(cfg, tmp_path / "run", match="lora.target_modules")
    out = capsys.readouterr().out
    assert out.index("found before reading any data") < out.index("max_seq_len=4096 (model context 2048)")
    assert "['query'] match no module" in messages(report)
    keys = [p["key"] for p in report["problems"]]
    assert "lora.target_modules" in keys and "data.max_seq_len" in keys
    lora = next(p for p in report["problems"] if p["key"] == "lora.target_modules")
    assert "q_proj" in lora["message"] and "v_proj" in lora["message"]


def test_too_little_data_for_the_world_size_fails(tmp_path, varied):
    cfg = make_cfg(tmp_path, varied, "launcher.name=torchrun", "launcher.nproc_per_node=4", "train.grad_accum=2")
    report = run_failing(cfg, tmp_path / "run", match="train.batch_size")
    assert "zero micro-batches per rank" in messages(report)
    assert report["plan"]["global_batch"] == 4 * 2 * 4


# --- the real, composed Hydra config ------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["longest", "packed"])
def test_shipped_default_config_passes_on_the_shipped_data(tmp_path, strategy):
    cfg = compose_real(f"data.cache_dir={tmp_path / 'tokens'}", "train.progress=false", f"padding={strategy}")
    result = run_preflight(cfg, tmp_path / "run")
    assert result.ok and set(result.splits) == {"train", "val"}
    assert result.max_seq_len >= max(stats.lengths["max"] for stats in result.splits.values())
    assert (tmp_path / "run" / "lengths.png").is_file()
    # Nothing malformed; the shipped set's own repeats are left out (data.duplicates=drop) and listed.
    listed = [json.loads(line) for line in (tmp_path / "run" / "rejects.jsonl").read_text().splitlines()]
    assert result.splits["train"].reject_reasons == {"duplicate": 206} and len(listed) == 206
    assert all(r["reason"].startswith("duplicate: the same tokens and targets as ") for r in listed)


def test_truncate_is_an_explicit_reported_policy(tmp_path, varied):
    # Plain text (continued pretraining): a cut document end is expected, the truncation is counted and reported.
    text = write_jsonl(tmp_path / "text.jsonl", [{"text": " ".join(["apple"] * n)} for n in (3, 30, 8, 40)])
    result = run_preflight(
        make_cfg(
            tmp_path,
            text,
            "data.format=text",
            "data.max_seq_len=24",
            "data.overlength=truncate",
            "padding.strategy=max_length",
        ),
        tmp_path / "run",
    )
    stats = result.splits["train"]
    assert result.ok and stats.over_limit == 2 and stats.truncated == 2 and stats.content.terminator_cut == 2
    assert any("will be truncated" in note for note in result.notes)
    report = run_failing(
        make_cfg(tmp_path, varied, "data.max_seq_len=24"),
        tmp_path / "run2",
        match=r"data.max_seq_len \(.*train.jsonl:\d+\)",
    )
    assert "data.max_seq_len=24 < longest train sample" in messages(report)


def test_truncate_that_cuts_the_final_eos_is_refused_and_truncate_prompt_keeps_it(tmp_path, varied):
    report = run_failing(
        make_cfg(tmp_path, varied, "data.max_seq_len=24", "data.overlength=truncate"),
        tmp_path / "run",
        match=r"\[truncation\] data.overlength \(.*train.jsonl:\d+\)",
    )
    problem = next(p for p in report["problems"] if p["check"] == "truncation")
    over = report["splits"]["train"]["over_limit"]
    assert over > 0 and f"cuts the final eos / end-of-turn of {over} data.train sample(s)" in problem["message"]
    assert "Fix: data.overlength=truncate_prompt" in problem["message"]
    result = run_preflight(
        make_cfg(tmp_path, varied, "data.max_seq_len=24", "data.overlength=truncate_prompt"), tmp_path / "run2"
    )
    stats = result.splits["train"]
    assert result.ok and stats.truncated == over and stats.content.terminator_cut == 0
    assert any("cut from the left of their prompt" in note for note in result.notes)


def test_truncation_that_cuts_every_target_drops_the_sample_and_says_where(tmp_path, varied):
    rows = [alpaca(2, i) for i in range(4)] + [{"instruction": "Say it. " * 30, "input": "", "output": "ok"}]
    train = write_jsonl(tmp_path / "prompty.jsonl", rows)
    result = run_preflight(
        make_cfg(tmp_path, train, "data.max_seq_len=32", "data.overlength=truncate"), tmp_path / "run"
    )
    # Dropped, not trained without its end: truncate's terminator check has nothing to refuse here.
    assert result.ok and result.splits["train"].dropped == 1 and result.splits["train"].truncated == 0
    note = next(n for n in result.notes if "keep no target" in n)
    assert "prompty.jsonl:5" in note
    # preflight.json counts the dropped sample, not a zero-target one left in the data.
    assert result.splits["train"].zero_target == 0


def test_pretokenized_ids_are_checked_against_the_model_with_file_and_line(tmp_path):
    train = write_jsonl(
        tmp_path / "ids.jsonl", [{"input_ids": [5, 6, 7, 8]}, {"input_ids": [5, 4050, 7]}, {"input_ids": [9, 10, 11]}]
    )
    small_model = [f"model.{key}={value}" for key, value in {**TINY_MODEL, "vocab_size": 4032}.items()]
    small_model.append("train.batch_size=2")
    report = run_failing(
        make_cfg(tmp_path, train, "data.format=tokenized", *small_model),
        tmp_path / "run",
        match=r"data.train \(.*ids.jsonl:2\)",
    )
    problem = next(p for p in report["problems"] if p["key"] == "data.train")
    assert "token id 4050" in problem["message"] and ">= model embedding rows 4032" in problem["message"]
    assert report["vocab"]["max_token_id"] == 4050
    result = run_preflight(
        make_cfg(tmp_path, train, "data.format=tokenized", *small_model, "model.resize_embeddings=true"),
        tmp_path / "run2",
    )
    assert result.ok and result.vocab.resized_to == 4096 and any("resized from 4032" in n for n in result.notes)


def test_memory_over_the_stated_device_memory_fails(tmp_path, varied):
    report = run_failing(
        make_cfg(tmp_path, varied, "preflight.device_memory_gib=0.0001"),
        tmp_path / "run",
        match=r"\[memory\] train.batch_size",
    )
    assert report["memory"]["device_gib"] == 0.0001 and report["memory"]["total_gib"] > 0.0001
    assert "a lean optimizer, FSDP or its CPU offload fits, alone or up to three together" in messages(report)


def test_memory_refusal_names_the_settings_that_would_fit(tmp_path, varied):
    """A device between the checkpointed and the plain estimate: the refusal names checkpointing, with its estimate."""
    full = ("recipe_name=sft", "lora.enabled=false")
    plain = run_preflight(make_cfg(tmp_path, varied, *full), tmp_path / "plain").memory.total_gib
    checkpointed = run_preflight(
        make_cfg(tmp_path, varied, *full, "model.gradient_checkpointing=true"), tmp_path / "ckpt"
    ).memory.total_gib
    assert checkpointed < plain
    device = (plain + checkpointed) / 2
    report = run_failing(
        make_cfg(tmp_path, varied, *full, f"preflight.device_memory_gib={device}"),
        tmp_path / "run",
        match=r"\[memory\] train.batch_size",
    )
    assert f"model.gradient_checkpointing=true (~{checkpointed:.1f} GiB)" in messages(report)


@pytest.mark.parametrize("strategy", [str(strategy) for strategy in PaddingStrategy])
def test_the_estimate_counts_the_micro_batches_the_plan_forms_not_max_seq_len(tmp_path, varied, strategy):
    """longest/bucket: every row padded to the longest sample, whatever data.max_seq_len (the same batches, the same
    estimate at 2048 and 16384); max_length: rows of max_seq_len; packed: batch_size rows of max_seq_len."""
    runs = {}
    for max_len in (2048, 16384):
        cfg = make_cfg(
            tmp_path,
            varied,
            f"padding.strategy={strategy}",
            f"data.max_seq_len={max_len}",
            "model.max_position_embeddings=16384",
            "data.tail=pad",  # packed: the 8 samples fill one row
        )
        result = run_preflight(cfg, tmp_path / f"run{max_len}")
        runs[max_len] = (load_plan(tmp_path / f"run{max_len}").micro_batch, result)
    (short, result), (long, _) = runs[2048], runs[16384]
    longest = result.splits["train"].lengths["max"]
    if strategy in ("longest", "bucket"):
        assert short == long == (4, longest)
        assert runs[2048][1].memory == runs[16384][1].memory
    else:
        assert (short, long) == ((4, 2048), (4, 16384))
        assert runs[16384][1].memory.activations_gib > 7 * runs[2048][1].memory.activations_gib


LLAMA3_8B_SHAPE = (
    "model.vocab_size=128256",
    "model.hidden_size=4096",
    "model.intermediate_size=14336",
    "model.num_layers=32",
    "model.num_heads=32",
    "model.num_kv_heads=8",
    "model.max_position_embeddings=16384",
    "model.dtype=bfloat16",
    "lora.rank=16",
)


def test_an_8b_shape_at_16k_over_the_device_lists_levers_and_the_first_one_passes(tmp_path, varied):
    """No weights are built: preflight counts the shapes. The refusal lists the levers with their estimated peaks
    (combined when none fits alone), each as overrides; applying the first printed passes preflight."""
    over = (*LLAMA3_8B_SHAPE, "padding.strategy=max_length", "data.max_seq_len=16384", "train.batch_size=8")
    report = run_failing(
        make_cfg(tmp_path, varied, *over, "preflight.device_memory_gib=24"),
        tmp_path / "run",
        match=r"\[memory\] train.batch_size",
    )
    message = messages(report)
    assert "> device memory 24.0 GiB. Fix: one of (each with its estimated peak) " in message
    levers = message.split("Fix: one of (each with its estimated peak) ")[1].rstrip(".").split("; or ")
    first, estimate = levers[0].split(" (~")
    assert first.split() == [
        "model.gradient_checkpointing=true",
        "train.batch_size=1",
        "train.grad_accum=8",
        "data.max_seq_len=8192",
        "data.overlength=truncate",
    ]
    result = run_preflight(
        make_cfg(tmp_path, varied, *over, "preflight.device_memory_gib=24", *first.split()), tmp_path / "fixed"
    )
    assert result.ok and result.memory.total_gib <= 24
    assert f"{result.memory.total_gib:.1f} GiB" == estimate.rstrip(")")


def test_activation_offload_on_cpu_and_fsdp_cpu_offload_without_fsdp_are_refused_with_the_reason(tmp_path, varied):
    report = run_failing(
        make_cfg(tmp_path, varied, "model.activation_offload=true", "train.fsdp_cpu_offload=true"),
        tmp_path / "run",
        match=r"\[backend\] model.activation_offload",
    )
    assert {p["key"] for p in report["problems"]} == {"model.activation_offload", "train.fsdp_cpu_offload"}
    text = messages(report)
    assert "already are in host memory here, so there is no device memory to save" in text
    assert "Fix: train.parallel=fsdp with launcher=torchrun launcher.nproc_per_node=2" in text


def test_what_an_offload_keeps_in_host_memory_is_checked_against_preflight_host_memory_gib(tmp_path, varied):
    """FSDP CPU offload across 2 ranks (planned, not launched: preflight.only): the shards, grads and optimizer
    state of both ranks against the stated host memory."""
    sharded = ("recipe_name=sft", "lora.enabled=false", "launcher.name=torchrun", "launcher.nproc_per_node=2")
    plan = (*sharded, "train.parallel=fsdp", "train.fsdp_cpu_offload=true")
    fits = run_preflight(make_cfg(tmp_path, varied, *plan), tmp_path / "fits").memory
    assert fits.host_gib > 0 and fits.host_memory_gib is not None and fits.grads_gib == fits.optimizer_gib == 0
    report = run_failing(
        make_cfg(tmp_path, varied, *plan, f"preflight.host_memory_gib={fits.host_gib / 2}"),
        tmp_path / "run",
        match=r"\[memory\] preflight.host_memory_gib",
    )
    assert f"train.fsdp_cpu_offload=true keeps ~{fits.host_gib:.1f} GiB in host memory" in messages(report)


def test_across_ranks_the_levers_include_fsdp_and_its_cpu_offload(tmp_path, varied):
    """A 2-rank full fine-tune (planned, not launched) on a device between its sharded and unsharded estimates: FSDP
    is offered as the exact override, with the estimate preflight gives the sharded plan."""
    ranks = ("recipe_name=sft", "lora.enabled=false", "launcher.name=torchrun", "launcher.nproc_per_node=2")
    plain = run_preflight(make_cfg(tmp_path, varied, *ranks), tmp_path / "plain").memory
    sharded = run_preflight(make_cfg(tmp_path, varied, *ranks, "train.parallel=fsdp"), tmp_path / "fsdp").memory
    device = (plain.total_gib + sharded.total_gib) / 2
    report = run_failing(
        make_cfg(tmp_path, varied, *ranks, f"preflight.device_memory_gib={device}"),
        tmp_path / "run",
        match=r"\[memory\] train.batch_size",
    )
    assert f"train.parallel=fsdp (~{sharded.total_gib:.1f} GiB)" in messages(report)


def test_the_plan_and_the_checks_that_need_no_data_load_no_torch_transformers_or_peft(tmp_path, varied):
    """What makes the first problem print fast: the CLI's entry, the plan's resolution and the fast checks run
    before any heavy library is imported (bench/first_error.py measures the seconds)."""
    code = (
        "import sys; from pathlib import Path\n"
        "import seqtune.__main__\n"
        "from seqtune.preflight.phases import fast_checks\n"
        "from seqtune.preflight.resolve import resolve_plan\n"
        "from tests.support.configs import make_cfg\n"
        f"cfg = make_cfg(Path({str(tmp_path)!r}), Path({str(varied)!r}), 'model.vocab_size=64')\n"
        "problems = fast_checks(cfg, resolve_plan(cfg, {}))\n"
        "print(sorted({p.key for p in problems}), sorted(m for m in ('torch', 'transformers', 'peft') "
        "if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "['model.resize_embeddings'] []", out.stdout + out.stderr[-2000:]


# --- honour or refuse: settings a path would ignore ------------------------------------------------------------------


def test_fp16_is_refused_for_gemma3_naming_the_fix(tmp_path, varied):
    gemma = {
        "model.family=gemma3",
        "model.num_kv_heads=1",
        "model.head_dim=64",
        "model.sliding_window=64",
        "model.sliding_window_pattern=6",
        "model.tie_word_embeddings=true",
        "model.num_heads=4",
        "model.intermediate_size=192",
        "model.max_position_embeddings=32768",
    }
    report = run_failing(
        make_cfg(tmp_path, varied, *sorted(gemma), "train.mixed_precision=fp16"),
        tmp_path / "run",
        match=r"train.mixed_precision",
    )
    assert "overflow float16" in messages(report) and "Fix: train.mixed_precision=bf16" in messages(report)
    assert run_preflight(make_cfg(tmp_path, varied, *sorted(gemma)), tmp_path / "run2").ok


def test_fp16_and_a_merged_export_are_refused_under_fsdp_across_ranks(tmp_path, varied):
    fsdp = ("launcher.name=torchrun", "launcher.nproc_per_node=2", "train.parallel=fsdp", "train.batch_size=2")
    report = run_failing(
        make_cfg(tmp_path, varied, *fsdp, "train.mixed_precision=fp16", "train.export_merged=true"),
        tmp_path / "run",
        match=r"train.export_merged",
    )
    keys = [p["key"] for p in report["problems"]]
    assert keys.count("train.mixed_precision") == 1 and "train.export_merged" in keys
    assert "per rank" in messages(report) and "merge_and_unload" in messages(report)
    assert not (tmp_path / "run" / "plan.json").exists()  # a refused run has no plan a rank could start from
    # One rank is not sharded: both are honoured there.
    assert run_preflight(
        make_cfg(tmp_path, varied, "train.parallel=fsdp", "train.mixed_precision=fp16", "train.export_merged=true"),
        tmp_path / "run2",
    ).ok


def test_a_missing_checkpoint_fails_once_with_preflight_json(tmp_path, varied):
    report = run_failing(
        make_cfg(
            tmp_path, varied, f"model.path={tmp_path / 'nowhere'}", "model.vocab_size=null", "tokenizer.source=bundled"
        ),
        tmp_path / "run",
        match="model.path",
    )
    assert report["problems"][0]["check"] == "load" and report["max_seq_len"] is None


def test_early_stopping_of_lora_is_refused_under_fsdp_across_ranks_only(tmp_path, varied):
    # The validation split is the training file itself: accepted on purpose (the duplicates check would refuse it).
    early = (
        "data.val=" + str(varied),
        "data.duplicates=keep",
        "train.eval_every=2",
        "train.early_stop_patience=2",
    )
    fsdp = ("launcher.name=torchrun", "launcher.nproc_per_node=2", "train.parallel=fsdp", "train.batch_size=2")
    report = run_failing(make_cfg(tmp_path, varied, *early, *fsdp), tmp_path / "run", match="train.early_stop_patience")
    assert "Fix: train.parallel=ddp" in messages(report)
    # A full fine-tune under FSDP, and LoRA on one rank, are honoured.
    assert run_preflight(make_cfg(tmp_path, varied, *early, *fsdp, "lora.enabled=false"), tmp_path / "run2").ok
    assert run_preflight(make_cfg(tmp_path, varied, *early, "train.parallel=fsdp"), tmp_path / "run3").ok


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (["train.early_stop_patience=3", "train.eval_every=5"], ["data.val=null", "Fix: data.val=PATH"]),
        (["train.early_stop_patience=3", "data.val=VAL"], ["train.eval_every=0", "Fix: train.eval_every=N"]),
        (["train.eval_samples=2", "train.eval_every=5"], ["train.eval_samples=2", "Fix: data.val=PATH"]),
        (
            ["train.eval_samples=2", "train.eval_every=5", "data.val=VAL", "data.format=text"],
            # The formats with prompts are the registry's, of the same kind.
            [
                "data.format=text",
                "Fix: train.eval_samples=0",
                "a format with prompts (alpaca, chat, input_output, sharegpt)",
            ],
        ),
        (
            ["train.eval_samples=2", "train.eval_every=5", "data.val=VAL", "data.train_on_prompt=true"],
            ["data.train_on_prompt=true", "Fix: train.eval_samples=0"],
        ),
        (["train.early_stop_min_delta=0.01"], ["has no effect", "Fix: train.early_stop_patience=N"]),
        (
            ["lora.enabled=false", "lora.use_dora=true"],
            ["lora.use_dora=true with lora.enabled=false", "recipe=lora_sft"],
        ),
        (
            ["train.early_stop_patience=-1", "train.eval_samples=-2", "train.eval_sample_tokens=0"],
            ["train.early_stop_patience=-1", "train.eval_samples=-2", "train.eval_sample_tokens=0"],
        ),
    ],
)
def test_settings_that_act_at_evals_are_refused_without_what_they_need(tmp_path, varied, overrides, needles):
    from seqtune.config import ConfigError

    overrides = [o.replace("VAL", str(varied)) for o in overrides]
    with pytest.raises(ConfigError) as info:
        make_cfg(tmp_path, varied, *overrides)
    assert info.value.exit_code == 2
    for needle in needles:
        assert needle in str(info.value)


def test_generated_samples_need_validation_prompts_and_preflight_counts_them(tmp_path, varied):
    # Validation is the training file itself, accepted on purpose (the duplicates check would refuse it).
    samples = ("train.eval_every=2", "train.eval_samples=20", "data.duplicates=keep")
    result = run_preflight(make_cfg(tmp_path, varied, f"data.val={varied}", *samples), tmp_path / "run")
    assert result.ok and "the validation split has 8 sample(s) with a prompt" in " ".join(result.notes)
    # Pre-tokenized rows without labels train on every token: nothing to complete.
    ids = write_jsonl(tmp_path / "ids.jsonl", [{"input_ids": [5, 6, 7, 8 + i]} for i in range(8)])
    report = run_failing(
        make_cfg(tmp_path, ids, f"data.val={ids}", "data.format=tokenized", *samples),
        tmp_path / "run2",
        match="train.eval_samples",
    )
    assert "no validation sample has a prompt" in messages(report) and "Fix: train.eval_samples=0" in messages(report)


def test_train_on_reasoning_false_is_refused_where_no_template_renders_a_reasoning_block(tmp_path, varied):
    # alpaca records are not rendered by a chat template: there is no <think> block to mask.
    report = run_failing(
        make_cfg(tmp_path, varied, "data.train_on_reasoning=false"), tmp_path / "run", match="data.train_on_reasoning"
    )
    assert report["problems"][0]["key"] == "data.train_on_reasoning"
    assert "Fix: data.train_on_reasoning=true" in messages(report)
