"""Input people have, through the real CLI on data made here (tiny models): JSON arrays, ShareGPT with tool turns
and tool definitions, OpenAI content parts, weighted sources in both data modes, and a validation split that never
comes from the demo. Parquet (with a column mapping), Arrow files and streams, `datasets` save_to_disk directories
and their refusals run through the same CLI in-process, in the hostile-input table (tests/hostile/cases.py, group
"input shape"), where each costs well under a second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqtune.data.cache import TokenCache
from seqtune.data.types import IGNORE_INDEX
from tests.support.cli import read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

BRIEFLY = ["train.max_steps=2", "train.eval_every=0", "train.log_every=1", "train.batch_size=4", "preflight.show=0"]
# Where the point is what preflight reads (training then reads the same token cache whatever the input was).
READ_ONLY = ["preflight.only=true", "preflight.show=0"]


def output(result) -> str:
    return result.stdout + result.stderr


def ok(result) -> None:
    assert result.returncode == 0, output(result)[-4000:]


def report(run_dir: Path) -> dict:
    return json.loads((run_dir / "preflight.json").read_text())


def alpaca(n: int, tag: str = "") -> list[dict]:
    return [{"instruction": f"Say {tag}{i}.", "input": "", "output": f"{tag}{i} said."} for i in range(n)]


def test_a_json_array_trains_and_rejects_name_the_element(tmp_path: Path):
    rows = [json.dumps(row) for row in alpaca(30)]
    rows[11] = '{"instruction": "broken", "output": nope}'  # element 12 is not JSON; the array's structure holds
    data = tmp_path / "train.json"
    data.write_text("[\n  " + ",\n  ".join(rows) + "\n]\n")
    run_dir = tmp_path / "run"
    ok(run_cli([f"data.train={data}", "data.max_bad_fraction=0.05", *BRIEFLY], run_dir))
    train = report(run_dir)["splits"]["train"]
    assert (train["records"], train["rejected"], train["reject_reasons"]) == (30, 1, {"bad_json": 1})
    [reject] = [json.loads(line) for line in (run_dir / "rejects.jsonl").read_text().splitlines()]
    assert (reject["file"], reject["line"]) == (str(data), 12)  # file:N, N = the element's 1-based position
    assert TokenCache.open(Path(report(run_dir)["caches"]["train"])).location(11) == f"{data}:13"
    assert len([m for m in read_metrics(run_dir) if "loss" in m]) == 2


def sharegpt(i: int) -> dict:
    call = {"name": "get_weather", "arguments": {"city": f"c{i}"}}
    return {
        "system": "Use the tools.",
        "conversations": [
            {"from": "human", "value": f"Weather in c{i}?"},
            {"from": "function_call", "value": json.dumps(call)},
            {"from": "observation", "value": f"{i}C"},
            {"from": "gpt", "value": f"It is {i}C in c{i}."},
        ],
    }


def test_sharegpt_tool_turns_render_with_the_template_and_train_on_the_calls(tmp_path: Path):
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps([sharegpt(i) for i in range(16)]))
    run_dir = tmp_path / "run"
    ok(
        run_cli(
            [
                "model=mistral_tiny",
                "tokenizer=mistral_v3",
                "data.format=sharegpt",
                f"data.train={data}",
                "model.resize_embeddings=true",
                *BRIEFLY,
            ],
            run_dir,
        )
    )
    train = report(run_dir)["splits"]["train"]
    assert (train["records"], train["rejected"]) == (16, 0)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "adapter")
    sample = TokenCache.open(Path(report(run_dir)["caches"]["train"]))[3]
    messages = [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "Weather in c3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call00001",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "c3"}},
                }
            ],
        },
        {"role": "tool", "content": "3C", "tool_call_id": "call00001"},
        {"role": "assistant", "content": "It is 3C in c3."},
    ]
    assert sample.input_ids.tolist() == tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False)
    targets = tokenizer.decode(sample.input_ids[sample.labels != IGNORE_INDEX])
    # The call and the reply, each with its </s> (decoding shows SentencePiece's word-start marks as spaces).
    assert (
        targets == '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "c3"}, "id": "call00001"}]</s>'
        " It is 3C in c3.</s>"
    )


def test_sharegpt_tool_definitions_reach_a_template_that_reads_them(tmp_path: Path):
    """(A template that never reads `tools` refuses such records: tests/hostile, sharegpt_tools_untemplated.)"""
    rows = [
        {**sharegpt(i), "tools": json.dumps([{"name": "get_weather", "parameters": {"type": "object"}}])}
        for i in range(8)
    ]
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(rows))
    common = [
        "model=llama3_tiny",
        "tokenizer=llama3",
        "data.format=sharegpt",
        f"data.train={data}",
        "model.resize_embeddings=true",
        *READ_ONLY,
    ]
    reads_tools = (
        "{{- bos_token }}{%- if tools %}{{- 'Tools: ' + tools | tojson + '\\n' }}{%- endif %}"
        "{%- for m in messages %}{%- set role = 'ipython' if m['role'] == 'tool' else m['role'] %}"
        "{%- if m['tool_calls'] is defined and m['tool_calls'] %}{{- role + ': ' + m['tool_calls'] | tojson }}"
        "{%- else %}{{- role + ': ' + m['content'] }}{%- endif %}{{- '<|eot_id|>' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- 'assistant: ' }}{%- endif %}"
    )
    template = tmp_path / "tools.jinja"
    template.write_text(reads_tools)
    run_dir = tmp_path / "run"
    ok(run_cli([*common, f"tokenizer.chat_template={template}"], run_dir))
    cache = TokenCache.open(Path(report(run_dir)["caches"]["train"]))
    assert report(run_dir)["splits"]["train"]["rejected"] == 0 and len(cache) == 8
    from transformers import AutoTokenizer

    from seqtune.tokenizers.pypi import tokenizer_dir

    text = AutoTokenizer.from_pretrained(tokenizer_dir("llama3")).decode(cache[0].input_ids)
    assert text.startswith('<|begin_of_text|>Tools: [{"type": "function", "function": {"name": "get_weather", ')


def test_openai_content_parts_and_null_tool_call_content_train(tmp_path: Path):
    call = {"id": "call00001", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    rows = [
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": f"Question {i}"},
                        {"type": "text", "text": "Please look it up."},
                    ],
                },
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": f"answer {i}", "tool_call_id": "call00001"},
                {"role": "assistant", "content": [{"type": "text", "text": f"It is answer {i}."}]},
            ]
        }
        for i in range(12)
    ]
    rows.append(
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]},
                {"role": "assistant", "content": "A cat."},
            ]
        }
    )
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run_dir = tmp_path / "run"
    ok(
        run_cli(
            [
                "model=llama3_tiny",
                "tokenizer=llama3",
                "data.format=chat",
                f"data.train={data}",
                "model.resize_embeddings=true",
                "data.max_bad_fraction=0.1",
                *READ_ONLY,
            ],
            run_dir,
        )
    )
    train = report(run_dir)["splits"]["train"]
    assert (train["records"], train["reject_reasons"]) == (13, {"unsupported_content": 1})
    from transformers import AutoTokenizer

    from seqtune.tokenizers.pypi import tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("llama3"))
    text = tokenizer.decode(TokenCache.open(Path(report(run_dir)["caches"]["train"]))[0].input_ids)
    assert "Question 0\nPlease look it up.<|eot_id|>" in text and '"name": "lookup"' in text


def mix_args(tmp_path: Path, weights: tuple[float, float]) -> list[str]:
    first, second = tmp_path / "a.json", tmp_path / "b.jsonl"
    first.write_text(json.dumps(alpaca(20, "a")))
    second.write_text("".join(json.dumps(row) + "\n" for row in alpaca(30, "b")))
    return [f"data.train=[{{path: {first}, weight: {weights[0]}}}, {{path: {second}, weight: {weights[1]}}}]"]


@pytest.mark.parametrize("mode", ["cached", "stream"])
def test_weighted_sources_mix_by_weight_and_the_batch_identity_follows_the_weights(tmp_path: Path, mode: str):
    run_dir = tmp_path / "run"
    # cached: a whole epoch; stream: a few steps (seqtune/data/stream.py's tests follow whole weighted passes)
    steps = ["train.max_steps=null", "train.epochs=1"] if mode == "cached" else []
    ok(run_cli([*mix_args(tmp_path, (2, 0.5)), f"data.mode={mode}", *BRIEFLY, *steps], run_dir))
    result = report(run_dir)
    sources = result["splits"]["train"]["sources"]
    assert [(s["key"], s["weight"], s["used_per_epoch"]) for s in sources] == [
        ("data.train[0]", 2.0, 40),
        ("data.train[1]", 0.5, 15),
    ]
    plan = result["plan"]["splits"]["train"]
    assert plan["samples"] == 55  # 2 x 20 + round(0.5 x 30)
    if mode == "cached":  # 13 micro-batches of 4 (tail dropped), each sample its weight's number of times
        assert sum(plan["samples_per_rank"]) == 52 and plan["steps_per_epoch"] == 13
        assert len([m for m in read_metrics(run_dir) if "loss" in m]) == 13
    else:  # the stream honours data.tail=drop as cached mode does: 13 full micro-batches, the rest left out
        assert result["stream_source_records"] == [20, 30] and plan["micro_batches_per_rank"] == 13
    identity = json.loads((run_dir / "plan.json").read_text())["batches"]
    assert [m["weight"] for m in identity["mix"]] == [2.0, 0.5]
    console = (run_dir / "seqtune.log").read_text()
    assert "data.train[1] (alpaca, 1 file): 30 records, 0 rejected, 30 samples, weight 0.5 -> 15 per epoch" in console
    other = tmp_path / "other"
    ok(run_cli([*mix_args(tmp_path, (2, 1)), f"data.mode={mode}", *READ_ONLY], other))
    changed = json.loads((other / "plan.json").read_text())["batches"]
    assert [m["weight"] for m in changed["mix"]] == [2.0, 1.0] and changed != identity


def test_data_train_alone_has_no_validation_and_val_fraction_holds_out_part_of_it(tmp_path: Path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in alpaca(200)))
    alone = tmp_path / "alone"
    result = run_cli([f"data.train={data}", "train.max_steps=1", "train.eval_every=1", "preflight.show=0"], alone)
    ok(result)
    assert set(report(alone)["splits"]) == {"train"} and "instruct" not in json.dumps(report(alone)["caches"])
    assert "validation: none (data.val=null" in output(result)
    assert json.loads((alone / "plan.json").read_text())["validation"] is None
    assert not [m for m in read_metrics(alone) if "eval_loss" in m]
    held = tmp_path / "held"
    result = run_cli(
        [f"data.train={data}", "data.val_fraction=0.2", "train.max_steps=1", "train.eval_every=1", "preflight.show=0"],
        held,
    )
    ok(result)
    splits = report(held)["splits"]
    assert splits["train"]["records"] + splits["val"]["records"] == 200 and 20 < splits["val"]["records"] < 60
    caches = {name: TokenCache.open(Path(path)) for name, path in report(held)["caches"].items()}
    where = {name: {cache.location(i) for i in range(len(cache))} for name, cache in caches.items()}
    assert not where["train"] & where["val"]  # disjoint
    assert "data.val_fraction=0.2" in output(result)
    assert json.loads((held / "plan.json").read_text())["validation"] == "data.val_fraction"
    assert [m for m in read_metrics(held) if "eval_loss" in m]


def test_parquet_arrow_and_a_saved_dataset_train_with_their_own_column_names(tmp_path: Path):
    """Columnar sources through the subprocess CLI to the end of training: each source maps its own columns, and
    a reject keeps file:row (the row's 1-based number in the file)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    def table(n: int, tag: str) -> pa.Table:
        rows = alpaca(n, tag)
        return pa.table({"prompt": [r["instruction"] for r in rows], "response": [r["output"] for r in rows]})

    parquet = tmp_path / "p.parquet"
    bad = table(12, "p").to_pylist()
    bad[4]["response"] = None  # row 5: a missing response is a reject, not a failure
    pq.write_table(pa.Table.from_pylist(bad), parquet, row_group_size=5)
    stream = tmp_path / "s.arrow"
    with pa.ipc.new_stream(str(stream), table(10, "s").schema) as writer:
        writer.write_table(table(10, "s"), max_chunksize=3)
    datasets.disable_progress_bars()
    datasets.Dataset.from_dict(table(14, "d").to_pydict()).save_to_disk(str(tmp_path / "saved"))
    mapped = "columns: {instruction: prompt, output: response}"
    train = (
        f"data.train=[{{path: {parquet}, {mapped}}}, {{path: {stream}, {mapped}}}, "
        f"{{path: {tmp_path / 'saved'}, {mapped}, weight: 2}}]"
    )
    run_dir = tmp_path / "run"
    ok(run_cli([train, "data.max_bad_fraction=0.1", *BRIEFLY], run_dir))
    split = report(run_dir)["splits"]["train"]
    assert (split["records"], split["rejected"]) == (36, 1)
    assert [(s["records"], s["used_per_epoch"]) for s in split["sources"]] == [(12, 11), (10, 10), (14, 28)]
    [reject] = [json.loads(line) for line in (run_dir / "rejects.jsonl").read_text().splitlines()]
    assert (reject["file"], reject["line"]) == (str(parquet), 5)
    assert len([m for m in read_metrics(run_dir) if "loss" in m]) == 2
