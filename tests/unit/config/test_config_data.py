"""The data group's sources, column mappings and validation split, as the typed schema checks them."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException

from seqtune.config import register_resolvers, register_schemas
from seqtune.config.errors import ConfigError
from seqtune.config.schema import DataConfig, DataFormat
from tests.support.configs import checked

register_schemas()
register_resolvers()


def test_a_split_is_a_list_of_sources_with_defaults_filled_in():
    data = DataConfig(
        train=[
            "a.jsonl",
            {"path": "b.parquet", "format": "sharegpt", "weight": 0.5},
            {"path": "c.json", "columns": {"output": "response"}},
        ],
        columns={"instruction": "prompt"},
    )
    a, b, c = data.sources("train")
    assert (a.key, a.path, a.format, a.columns, a.weight) == (
        "data.train[0]",
        "a.jsonl",
        DataFormat.alpaca,
        {"instruction": "prompt"},
        1.0,
    )
    # data.columns applies to the sources in data.format only; a source's own columns replace it.
    assert (b.format, b.columns, b.weight, b.columns_key) == (DataFormat.sharegpt, {}, 0.5, "data.columns")
    assert (c.columns, c.columns_key) == ({"output": "response"}, "data.train[2].columns")
    assert DataConfig(train="a.jsonl").sources("train")[0].key == "data.train"
    assert DataConfig(train="a.jsonl").sources("val") == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (dict(train=[]), r"data\.train=\[\] is an empty list"),
        (
            dict(train=[{"path": "a", "shuffle": True}]),
            r"data\.train\[0\]\.shuffle is not a setting of a data source\. "
            r"Fix: use only path, format, weight, columns",
        ),
        (dict(train=[{"weight": 2}]), r"data\.train\[0\] has no path"),
        (
            dict(train=[{"path": "a", "format": "orca"}]),
            r"data\.train\[0\]\.format='orca' is not a data format.*sharegpt",
        ),
        (dict(train=[{"path": "a", "weight": 0}]), r"data\.train\[0\]\.weight=0 must be a number > 0"),
        (dict(train=[{"path": "a", "weight": float("nan")}]), r"data\.train\[0\]\.weight=nan must be a number > 0"),
        (dict(train="a", val=[{"path": "v", "weight": 2}]), r"data\.val\[0\]\.weight=2: weights mix training sources"),
        (
            dict(train="a", columns={"response": "output"}),
            r"data\.columns\.response: 'response' is not a field of the "
            r"alpaca format \(its fields: instruction, output, input, system, history\)",
        ),
        (
            dict(train=[{"path": "a", "format": "chat", "columns": {"messages": ""}}]),
            r"data\.train\[0\]\.columns\.messages='' must be the name of a field in the data",
        ),
        (
            dict(train="a", val="v", val_fraction=0.1),
            r"data\.val_fraction=0\.1 and data\.val='v' both define the "
            r"validation split",
        ),
        (dict(train="a", val_fraction=1.0), r"data\.val_fraction=1\.0 must be within \[0, 1\)"),
        (dict(train=3), r"data\.train=3 is not a path, a glob or a list of them"),
    ],
)
def test_bad_sources_are_refused_naming_the_key_and_the_fix(data, message):
    with pytest.raises(ConfigError, match=message):
        DataConfig(**data)


def _compose(overrides: list[str]):
    with initialize_config_module(config_module="seqtune.configs", version_base=None):
        return checked(compose(config_name="config", overrides=overrides))


def test_the_demo_val_set_only_comes_with_the_demo_train_set(tmp_path):
    assert _compose([]).data.val.endswith("data/assets/instruct/val.jsonl")
    assert _compose([f"data.train={tmp_path / 'mine.jsonl'}"]).data.val is None
    assert _compose([f"data.train={tmp_path / 'mine.jsonl'}", f"data.val={tmp_path / 'v.jsonl'}"]).data.val == str(
        tmp_path / "v.jsonl"
    )
    assert _compose(["data.val=null"]).data.val is None


def test_duplicates_are_dropped_by_default_and_the_old_threshold_is_refused(tmp_path):
    assert _compose([]).data.duplicates == "drop"
    assert _compose([f"data.train={tmp_path / 'mine.jsonl'}", "data.duplicates=refuse"]).data.duplicates == "refuse"
    # The old threshold is gone: set, it is refused naming the key, never ignored.
    with pytest.raises(ConfigCompositionException, match="Could not override 'data.max_duplicate_fraction'"):
        _compose(["data.max_duplicate_fraction=0.2"])


def test_sources_and_columns_compose_from_the_command_line(tmp_path):
    data = _compose(
        [
            f"data.train=[{{path: {tmp_path}/a.json, weight: 2}}, {tmp_path}/b.parquet]",
            "data.columns={instruction: prompt, output: response}",
        ]
    ).data
    assert [(s.path, s.weight, s.columns) for s in data.sources("train")] == [
        (f"{tmp_path}/a.json", 2.0, {"instruction": "prompt", "output": "response"}),
        (f"{tmp_path}/b.parquet", 1.0, {"instruction": "prompt", "output": "response"}),
    ]


def test_whether_a_run_has_validation_is_one_fact_that_val_fraction_answers_too(tmp_path):
    from seqtune.config.plan import validation_key

    mine = f"data.train={tmp_path / 'mine.jsonl'}"
    evals = ["train.eval_every=2", "train.early_stop_patience=2", "train.eval_samples=2"]
    held = _compose([mine, "data.val_fraction=0.1", *evals])  # accepted: the holdout is a validation split
    assert validation_key(held.data.val, held.data.val_fraction) == "data.val_fraction"
    with pytest.raises(ConfigError) as info:
        _compose([mine, *evals])
    assert "no validation split (data.val=null, data.val_fraction=0)" in str(info.value)
    assert "data.val_fraction=0.05" in str(info.value)
    given = _compose([mine, f"data.val={tmp_path / 'v.jsonl'}"])
    assert validation_key(given.data.val, given.data.val_fraction) == "data.val"


def test_a_dpo_recipe_on_sharegpt_names_the_preference_format_that_reads_sharegpt_pairs(tmp_path):
    """LLaMA-Factory's pairs are ShareGPT or Alpaca shaped: the fix must point at data.format=preference, which reads
    them as they are, not at an SFT format the DPO recipe refuses."""
    with pytest.raises(ConfigError) as info:
        _compose(["recipe=lora_dpo", f"data.train={tmp_path / 'dpo_en_demo.json'}", "data.format=sharegpt"])
    message = " ".join(str(info.value).split())
    assert "data.format=sharegpt" in message and "Fix: data.format=preference" in message
    assert "ShareGPT {conversations, chosen, rejected}" in message
