"""Data at the edges, through the real CLI on data made here (tiny models): a public Alpaca-shaped set with a few
exact duplicates (dropped by default, in both data modes; keep and refuse as asked; a validation copy of a train
sample still refused), system/user/assistant Parquet under data.format=alpaca (with history turns), the fix a
refused system column suggests, applied as given, and media references that name no file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from seqtune.data.cache import TokenCache
from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

BRIEFLY = ["train.max_steps=2", "train.eval_every=0", "train.log_every=1", "train.batch_size=4", "preflight.show=0"]
READ_ONLY = ["preflight.only=true", "preflight.show=0", "preflight.plot=false"]
UNIQUE, COPIES = 60, (7, 23, 41)  # a public set's few repeats: 3 of 63 lines (4.8%)


def output(result) -> str:
    return result.stdout + result.stderr


def ok(result) -> None:
    assert result.returncode == 0, output(result)[-4000:]


def refused(result, run_dir: Path, *needles: str) -> list[dict]:
    """Exit 2, every needle in the output; the problems of preflight.json."""
    text = output(result)
    assert result.returncode == 2, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    for needle in needles:
        assert needle in text, f"{needle!r} not in output:\n{text[-6000:]}"
    return json.loads((run_dir / "preflight.json").read_text())["problems"]


def report(run_dir: Path) -> dict:
    return json.loads((run_dir / "preflight.json").read_text())


@pytest.fixture(scope="module")
def public_set(tmp_path_factory) -> Path:
    """Alpaca records as a public set ships them: a few lines repeat earlier ones exactly."""
    rows = [
        {"instruction": f"Name the number {i}.", "input": "" if i % 3 else f"in words {i}", "output": f"It is {i}."}
        for i in range(UNIQUE)
    ]
    lines = []
    for i, row in enumerate(rows):
        lines += [json.dumps(row)] * (2 if i in COPIES else 1)  # row 7 is line 8, its copy line 9, ...
    path = tmp_path_factory.mktemp("public") / "alpaca_public.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("mode", ["cached", "stream"])
def test_a_public_set_with_a_few_duplicates_trains_by_default_with_the_copies_counted(tmp_path, public_set, mode):
    run_dir = tmp_path / "run"
    ok(run_cli([f"data.train={public_set}", f"data.mode={mode}", *BRIEFLY], run_dir))
    found = report(run_dir)
    train = found["splits"]["train"]
    assert (train["records"], train["reject_reasons"]) == (UNIQUE + len(COPIES), {"duplicate": len(COPIES)})
    # The plan counts the samples without the copies (stream mode: the records a pass deals).
    assert found["plan"]["splits"]["train"]["samples"] == UNIQUE
    [note] = [n for n in found["notes"] if n.startswith("data.duplicates=drop")]
    assert f"{len(COPIES)} of {UNIQUE + len(COPIES)} data.train records" in note
    assert f"(first: {public_set}:9, the same tokens and targets as {public_set}:8)" in note
    assert "data.duplicates=drop: 3 of 63 data.train records are exact duplicates" in output(
        run_cli([f"data.train={public_set}", f"data.mode={mode}", *READ_ONLY], tmp_path / "again")
    )
    rejects = [json.loads(line) for line in (run_dir / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [
        (9, f"duplicate: the same tokens and targets as {public_set}:8"),
        (26, f"duplicate: the same tokens and targets as {public_set}:25"),
        (45, f"duplicate: the same tokens and targets as {public_set}:44"),
    ]
    assert len(TokenCache.open(Path(found["caches"]["train"]))) == UNIQUE
    assert len([m for m in read_metrics(run_dir) if "loss" in m]) == 2


def test_stream_mode_with_a_preflight_sample_drops_the_copies_past_it_too(tmp_path, public_set):
    run_dir = tmp_path / "run"
    ok(run_cli([f"data.train={public_set}", "data.mode=stream", "data.preflight_sample=20", *BRIEFLY], run_dir))
    found = report(run_dir)
    assert found["splits"]["train"]["reject_reasons"] == {"duplicate": 1}  # line 9, in the sample's 20
    assert found["stream_source_records"] == [UNIQUE] and found["plan"]["splits"]["train"]["samples"] == UNIQUE
    assert any(note.startswith("data.duplicates=drop: 2 data.train records past") for note in found["notes"])
    rejects = [json.loads(line) for line in (run_dir / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [
        (9, f"duplicate: the same tokens and targets as {public_set}:8"),
        (26, f"duplicate: repeats {public_set}:25 exactly as written (past data.preflight_sample)"),
        (45, f"duplicate: repeats {public_set}:44 exactly as written (past data.preflight_sample)"),
    ]
    assert len([m for m in read_metrics(run_dir) if "loss" in m]) == 2


def test_keep_trains_every_copy_and_refuse_refuses_naming_the_key_and_the_fix(tmp_path, public_set):
    kept = tmp_path / "kept"
    ok(run_cli([f"data.train={public_set}", "data.duplicates=keep", *READ_ONLY], kept))
    found = report(kept)
    assert found["plan"]["splits"]["train"]["samples"] == UNIQUE + len(COPIES)
    assert found["splits"]["train"]["content"]["duplicates"] == len(COPIES)
    assert any("kept (data.duplicates=keep)" in note for note in found["notes"])
    # Another cache: the one data.duplicates=drop wrote holds other samples.
    dropped = tmp_path / "dropped"
    ok(run_cli([f"data.train={public_set}", *READ_ONLY], dropped))
    assert report(dropped)["caches"]["train"] != found["caches"]["train"]

    run_dir = tmp_path / "refused"
    [problem] = refused(
        run_cli([f"data.train={public_set}", "data.duplicates=refuse", *READ_ONLY], run_dir),
        run_dir,
        "[duplicates] data.duplicates",
    )
    assert problem["key"] == "data.duplicates" and problem["location"] == f"{public_set}:9"
    assert "3 of 63 data.train samples (4.76%) are exact duplicates of another sample" in problem["message"]
    assert f"{public_set}:9 (= line 8)" in problem["message"]
    assert (
        "Fix: data.duplicates=drop (the default: train one copy of each), or data.duplicates=keep" in problem["message"]
    )


def test_a_validation_sample_found_in_train_stays_refused(tmp_path, public_set):
    val = tmp_path / "val.jsonl"
    val.write_text(
        json.dumps({"instruction": "Something else.", "input": "", "output": "Else."})
        + "\n"
        + public_set.read_text().splitlines()[4]
        + "\n"
    )
    run_dir = tmp_path / "run"
    [problem] = refused(
        run_cli([f"data.train={public_set}", f"data.val={val}", *READ_ONLY], run_dir), run_dir, "[duplicates]"
    )
    assert problem["key"] == "data.duplicates" and problem["location"] == f"{val}:2"
    assert f"{val}:2 (= {public_set}:5)" in problem["message"]
    assert "1 of 2 data.val samples (50.00%) are exact duplicates of data.train samples" in problem["message"]
    assert "Fix: remove them from data.val" in problem["message"]


def _parquet(path: Path, columns: dict[str, list]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return path


def _system_rows(n: int) -> dict[str, list]:
    return {
        "system": [f"You answer in {'French' if i % 2 else 'English'}." for i in range(n)],
        "instruction": [f"Count to {i}." for i in range(n)],
        "output": [" ".join(str(k) for k in range(i + 1)) for i in range(n)],
        "history": [[["Hello.", "Hi."]] if i % 4 == 0 else [] for i in range(n)],
    }


def test_alpaca_parquet_with_system_and_history_trains_with_a_held_out_split(tmp_path):
    data = _parquet(tmp_path / "sys.parquet", _system_rows(80))
    run_dir = tmp_path / "run"
    ok(run_cli([f"data.train={data}", "data.val_fraction=0.1", *BRIEFLY], run_dir))
    found = report(run_dir)
    assert found["splits"]["train"]["rejected"] == 0 and found["splits"]["val"]["records"] > 0
    cache = TokenCache.open(Path(found["caches"]["train"]))
    first = cache[0]  # row 1: a history turn, then the system prompt's answer
    from transformers import AutoTokenizer

    from seqtune.tokenizers.location import BUNDLED_DIR

    text = AutoTokenizer.from_pretrained(BUNDLED_DIR).decode(first.input_ids)
    assert text.index("You answer in English.") < text.index("### Instruction:\nHello.\n\n### Response:\nHi.")
    assert text.index("Hi.") < text.index("### Instruction:\nCount to 0.")


def test_a_system_column_the_format_cannot_read_is_one_problem_whose_fix_works(tmp_path):
    rows = _system_rows(80)
    data = _parquet(
        tmp_path / "io.parquet", {"system": rows["system"], "prompt": rows["instruction"], "reply": rows["output"]}
    )
    common = [f"data.train={data}", "data.val_fraction=0.1", "data.format=input_output", *READ_ONLY]
    run_dir = tmp_path / "refused"
    mapped = "data.columns={input: prompt, output: reply}"
    [problem] = refused(run_cli([*common, mapped], run_dir), run_dir, "'system' column")
    assert problem["key"] == "data.columns"  # train and the held-out validation split read one file: one problem
    fix = re.search(r"Fix: (data\.format=alpaca) (data\.columns=\{[^}]*\})", problem["message"])
    assert fix, problem["message"]
    assert fix.group(2) == "data.columns={instruction: prompt, output: reply, system: system}"
    fixed = tmp_path / "fixed"
    ok(run_cli([*common, fix.group(1), fix.group(2)], fixed))
    assert report(fixed)["splits"]["train"]["rejected"] == 0


def test_an_img_reference_on_a_text_model_is_refused_naming_the_line_whatever_its_file(tmp_path):
    """issue 45 item 10: it trained as the literal text <img>imgs/cat.png</img>, the image silently dropped. Now
    every one is refused before its file is looked at: an existing image, an empty reference, a directory, a
    missing file all say the same (the model would never read the file, so the file is no fix to offer). Their
    empty_media / media_not_file / missing_media reasons on an image-text model: tests/unit/data/test_formats.py."""
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "cat.png").write_bytes(b"png")
    rows = [{"input": f"What is {i}?", "output": f"A cat, {i}."} for i in range(20)]
    for n, ref in ((4, "imgs/cat.png"), (9, ""), (13, "imgs"), (17, "imgs/dog.png")):
        rows[n]["input"] = f"<img>{ref}</img> What is this?"
    data = tmp_path / "media.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run_dir = tmp_path / "run"
    [problem] = refused(
        run_cli([f"data.train={data}", "data.format=input_output", *READ_ONLY], run_dir),
        run_dir,
        f"{data}:5",
    )
    assert problem["key"] == "data.max_bad_fraction" and problem["location"] == f"{data}:5"
    assert "4 of 20 train lines are malformed" in problem["message"] and "unsupported_content x4" in problem["message"]
    assert (
        f"{data}:5 (unsupported_content: input holds an image reference (<img>...</img>) and this model reads text "
        "only; an image-text model reads it as an image (model=gemma3_vision_tiny, model=gemma3_4b), or remove the "
        "reference (text written <img>...</img> is always one: there is no escape))" in problem["message"]
    )
    rejects = [json.loads(line) for line in (run_dir / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"].split(":")[0]) for r in rejects] == [
        (n, "unsupported_content") for n in (5, 10, 14, 18)
    ]
