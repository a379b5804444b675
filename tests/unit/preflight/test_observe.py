"""observe_split on real token caches written by scan_split with the bundled tokenizer (no mocks)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from seqtune.data.tokenize import SampleEncoder
from seqtune.preflight.observe import (
    HASH_FILE,
    NON_CONTROL,
    OBSERVATIONS_FILE,
    SAMPLE_END,
    literal_pattern,
    observe_split,
    scan_literal_controls,
)
from seqtune.tokenizers import BUNDLED_DIR
from seqtune.tokenizers.control import control_tokens, literal_controls, whitespace_ids
from seqtune.tokenizers.templates import ReasoningBlock
from tests.support.splits import files_split, scan_files


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(BUNDLED_DIR)


def write(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def observe(tmp_path: Path, tokenizer, fmt: str, rows: list, **encoder):
    encoder = SampleEncoder(tokenizer, fmt, train_on_prompt=encoder.get("train_on_prompt", False))
    scan = scan_files("train", [write(tmp_path / "data.jsonl", rows)], encoder, cache_root=tmp_path / "tokens")
    observed = observe_split(
        scan.cache_dir,
        control=control_tokens(tokenizer),
        literal=literal_controls(tokenizer),
        bos_id=encoder.bos_id,
        scan_text=fmt != "tokenized",
        space_ids=whitespace_ids(tokenizer),
    )
    return scan, observed


def test_every_completion_is_one_span_ending_on_eos_and_duplicates_hash_alike(tmp_path, tokenizer):
    rows = [
        {"instruction": "Add 2 and 3.", "output": "5"},
        {"instruction": "Name a fruit.", "output": "pear"},
        {"instruction": "Add 2 and 3.", "output": "5"},
        {"instruction": "Add 2 and 3.", "output": "6"},
    ]
    scan, observed = observe(tmp_path, tokenizer, "alpaca", rows)
    eos, bos = tokenizer.eos_token_id, tokenizer.bos_token_id
    assert observed.samples == 4 and observed.turns == 4
    assert list(observed.run_ends) == [(eos, SAMPLE_END)]
    assert observed.run_ends[(eos, SAMPLE_END)].locations[0].endswith("data.jsonl:1")
    assert observed.control_inputs == {bos: 4, eos: 4} and observed.control_targets == {eos: 4}
    hashes = observed.hashes()
    assert hashes[0] == hashes[2] and len(set(hashes.tolist())) == 3
    # Stored beside the cache: a re-run reads them back instead of reading the cache again.
    assert (scan.cache_dir / OBSERVATIONS_FILE).is_file() and (scan.cache_dir / HASH_FILE).is_file()
    again = observe_split(scan.cache_dir, control={}, literal={}, bos_id=None, scan_text=False)
    assert again.run_ends == observed.run_ends and (again.hashes() == hashes).all()


def test_chat_spans_end_on_the_templates_turn_closer(tmp_path, tokenizer):
    chat = {
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "3+3?"},
            {"role": "assistant", "content": "6"},
        ]
    }
    _, observed = observe(tmp_path, tokenizer, "chat", [chat])
    end, user = tokenizer.convert_tokens_to_ids("<|end|>"), tokenizer.convert_tokens_to_ids("<|user|>")
    # The bundled template: "...4<|end|>\n<|user|>..." then the last reply "6<|end|>\n</s>". The newline after the
    # first <|end|> is a target too (render_chat's span runs one character into the next turn): skipped over.
    assert set(observed.run_ends) == {(end, user), (tokenizer.eos_token_id, SAMPLE_END)}


def test_pretokenized_rows_with_two_bos_and_a_masked_end_of_turn(tmp_path, tokenizer):
    bos, eos, end = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|end|>")
    rows = [
        {"input_ids": [bos, bos, 300, 301, eos]},
        {"input_ids": [bos, 300, 301, end, 302, 303, eos], "labels": [-100, -100, 301, -100, -100, 303, eos]},
        {"input_ids": [bos, 300, 301, eos]},
    ]
    _, observed = observe(tmp_path, tokenizer, "tokenized", rows)
    assert observed.double_bos.count == 1 and observed.double_bos.locations[0].endswith("data.jsonl:1")
    assert observed.run_ends[(NON_CONTROL, end)].locations == [f"{tmp_path / 'data.jsonl'}:2"]
    assert observed.literal_lines.count == 0  # pre-tokenized data has no text to scan


def test_control_strings_written_in_text_are_found_per_line(tmp_path, tokenizer):
    rows = [
        {"instruction": "Say hi.", "output": "hi"},
        {"instruction": "Close with <|end|> please", "output": "ok"},
        '{"instruction": "slash-escaped <\\/s> end", "output": "x"}',
        {"instruction": "an html <s>strike</s>", "output": "y"},
    ]
    _, observed = observe(tmp_path, tokenizer, "alpaca", rows)
    assert observed.literal_lines.count == 3
    assert observed.literal_controls["<|end|>"].count == 1
    assert [loc.rsplit(":", 1)[1] for loc in observed.literal_controls["</s>"].locations] == ["3", "4"]
    assert observed.literal_controls["<s>"].locations[0].endswith(":4")
    # Stream mode scans a sample: only the lines it read are searched.
    per_token, lines = scan_literal_controls(
        files_split("train", [tmp_path / "data.jsonl"], "alpaca"), literal_controls(tokenizer), max_lines=2
    )
    assert lines.count == 1 and set(per_token) == {"<|end|>"}


def test_hashes_tell_targets_apart(tmp_path, tokenizer):
    row = {"instruction": "Add 2 and 3.", "output": "5"}
    _, plain = observe(tmp_path / "a", tokenizer, "alpaca", [row])
    _, on_prompt = observe(tmp_path / "b", tokenizer, "alpaca", [row], train_on_prompt=True)
    # Same tokens, different targets: not the same training sample.
    assert plain.hashes()[0] != on_prompt.hashes()[0]
    assert np.array_equal(plain.hashes(), plain.hashes())


def test_the_literal_pattern_takes_the_longest_token_and_scales_to_thousands_of_reserved_ones():
    literal = {"<|end|>": 7, "<|endoftext|>": 9, "</s>": 2, **{f"<unused{i}>": 100 + i for i in range(5000)}}
    pattern, forms = literal_pattern(literal)
    line = b'{"text": "a <|endoftext|> b <|end|> c <\\/s> <unused4999> <unused49> <b>bold</b>"}'
    assert [forms[m] for m in pattern.findall(line)] == [
        "<|endoftext|>",
        "<|end|>",
        "</s>",
        "<unused4999>",
        "<unused49>",
    ]


def test_damaged_stored_observations_are_computed_again(tmp_path, tokenizer):
    rows = [{"instruction": "Add 2 and 3.", "output": "5"}, {"instruction": "Name a fruit.", "output": "pear"}]
    scan, observed = observe(tmp_path, tokenizer, "alpaca", rows)
    (scan.cache_dir / OBSERVATIONS_FILE).write_text('{"samples": 2, "run_')  # cut short
    (scan.cache_dir / HASH_FILE).write_bytes(b"\0" * 3)
    again = observe_split(
        scan.cache_dir,
        control=control_tokens(tokenizer),
        literal=literal_controls(tokenizer),
        bos_id=tokenizer.bos_token_id,
        scan_text=True,
        space_ids=whitespace_ids(tokenizer),
    )
    assert again.run_ends == observed.run_ends and (again.hashes() == observed.hashes()).all()
    assert json.loads((scan.cache_dir / OBSERVATIONS_FILE).read_text())["samples"] == 2


def test_an_image_records_reasoning_block_is_parsed_with_the_runs_image_setting(tmp_path):
    """A reply opening with its reasoning block, in a record with an image part: its markers are data (the parser
    takes the block out). Parsed without the image-text run's image setting, the record was rejected (an image
    part on a text-only model) and its markers judged misplaced, as written."""
    (tmp_path / "cat.png").write_bytes(b"png")  # parsing resolves the path; the bytes are decoded later
    user = {"role": "user", "content": [{"type": "image", "image": "cat.png"}, {"type": "text", "text": "What?"}]}
    reply = {"role": "assistant", "content": "<think>round, red</think>A red circle."}
    (tmp_path / "data.jsonl").write_text(json.dumps({"messages": [user, reply]}) + "\n")
    split = files_split("train", [tmp_path / "data.jsonl"], "chat")
    literal = {"<think>": 1, "</think>": 2}
    block = ReasoningBlock(open="<think>", close="</think>", rendered=True)
    text_only, _ = scan_literal_controls(split, literal, reasoning=block)
    assert set(text_only) == {"<think>", "</think>"}  # what a text-only run's parser sees: a rejected record
    per_token, lines = scan_literal_controls(
        split, literal, reasoning=block, image_placeholder="<start_of_image>", media_root=str(tmp_path)
    )
    assert per_token == {} and lines.count == 0
