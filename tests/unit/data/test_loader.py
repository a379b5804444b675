"""build_train_batches end to end on the real preflight, the bundled tokenizer and small JSONL files (CPU, seconds).

cached: SplitView's over-length policy, PlannedBatches resume. stream: the same samples as cached mode, exact resume
(within and across passes, with DataLoader workers), disjoint complete coverage over 2 ranks simulated in-process
with equal batch counts, bad lines in rejects.jsonl once, and data.max_bad_fraction enforced online.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from seqtune.config import RootConfig
from seqtune.config.errors import DataError
from seqtune.config.plan import World
from seqtune.data.cache import TokenCache
from seqtune.data.loader import PlannedBatches, StreamedBatches, build_train_batches
from seqtune.data.tokenize import SampleEncoder
from seqtune.data.view import SplitView
from tests.support.data import write_jsonl
from tests.support.loader import make_cfg, prepare
from tests.support.splits import scan_files

WORDS = ("apple", "river", "candle", "orbit", "meadow", "copper")


def alpaca(i: int) -> dict:
    return {"instruction": f"Repeat word {i}.", "input": "", "output": " ".join([WORDS[i % 6]] * (1 + i % 7))}


def batches_for(cfg: RootConfig, prepared, rank: int = 0, world_size: int = 1):
    """Rank `rank`'s batches; another world size stands for the plan a run with that many ranks resolves."""
    preflight, plan, tokenizer = prepared
    if world_size != plan.world.world_size:
        plan = replace(plan, world=World(nnodes=1, nproc_per_node=world_size, source="test"))
    return build_train_batches(cfg, plan, rank=rank, tokenizer=tokenizer)


def rows_of(batch: dict) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(input_ids, targets) of every row with a target (fillers have none), padding cut off."""
    out = []
    for ids, targets, mask in zip(batch["input_ids"], batch["targets"], batch["attention_mask"], strict=True):
        if (targets != -100).any():
            keep = mask.bool()
            out.append((tuple(ids[keep].tolist()), tuple(targets[keep].tolist())))
    return out


def samples(batches) -> Counter:
    return Counter(row for batch in batches for row in rows_of(batch))


def roundtrip(state: dict) -> dict:
    return json.loads(json.dumps(state))  # plain values only, as the checkpoint stores them


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "train.jsonl", [alpaca(i) for i in range(23)])


# --- cached mode -----------------------------------------------------------------------------------------------


@pytest.fixture()
def cache(tmp_path: Path, corpus: Path, bundled_tokenizer) -> TokenCache:
    encoder = SampleEncoder(bundled_tokenizer, "alpaca", train_on_prompt=False)
    return scan_files("train", [corpus], encoder, cache_root=tmp_path / "tokens").cache()


def test_split_view_drop_hides_long_samples_and_truncate_cuts_them(cache: TokenCache) -> None:
    limit = int(np.median(cache.lengths))
    dropped = SplitView(cache, max_seq_len=limit, overlength="drop")
    assert len(dropped) == int((cache.lengths <= limit).sum()) < len(cache)
    assert all(len(dropped[i]) <= limit for i in range(len(dropped)))
    cut = SplitView(cache, max_seq_len=limit, overlength="truncate")
    assert len(cut) == len(cache) - len(cut.cut) and int(cut.lengths.max()) == limit
    longest = int(cache.lengths.argmax())
    np.testing.assert_array_equal(cut[longest].input_ids, cache[longest].input_ids[:limit])
    np.testing.assert_array_equal(cut[longest].labels, cache[longest].labels[:limit])


@pytest.mark.parametrize("stop_after", [1, 7, 30])  # 30: past the first epoch (23 samples)
def test_planned_batches_resume_yields_exactly_the_remaining_batches(tmp_path, corpus, stop_after) -> None:
    cfg = make_cfg(tmp_path, corpus, "train.batch_size=2")
    prepared = prepare(cfg, tmp_path / "run")
    first = batches_for(cfg, prepared)
    assert isinstance(first, PlannedBatches)
    expected = [rows_of(b) for b in islice(first, 40)]
    stopped = batches_for(cfg, prepared)
    taken = [rows_of(b) for b in islice(stopped, stop_after)]
    resumed = batches_for(cfg, prepared)
    resumed.load_state_dict(roundtrip(stopped.state_dict()))
    assert taken + [rows_of(b) for b in islice(resumed, 40 - stop_after)] == expected


def test_cached_mode_refuses_a_stream_checkpoint_position(tmp_path, corpus) -> None:
    stream_cfg = make_cfg(tmp_path, corpus, "data.mode=stream", "train.batch_size=2")
    prepared = prepare(stream_cfg, tmp_path / "stream")
    saved = batches_for(stream_cfg, prepared).state_dict()
    cached_cfg = make_cfg(tmp_path, corpus, "train.batch_size=2")
    prepared = prepare(cached_cfg, tmp_path / "cached")
    cached = batches_for(cached_cfg, prepared)
    with pytest.raises(DataError, match=r"data.mode=stream.*Fix: data.mode=stream"):
        cached.load_state_dict(roundtrip(saved))


# --- stream mode -----------------------------------------------------------------------------------------------


def one_pass(batches: StreamedBatches) -> list[dict]:
    return list(islice(batches, batches.batches_per_rank))


# (truncate itself is refused by preflight on a prompt/completion format: it cuts the final eos.)
@pytest.mark.parametrize("overlength", ["truncate_prompt", "drop"])
def test_stream_gives_the_same_samples_as_cached_mode(tmp_path, corpus, overlength) -> None:
    common = ("data.max_seq_len=28", f"data.overlength={overlength}", "data.shuffle=false")
    cached_cfg = make_cfg(tmp_path, corpus, *common)
    cached = batches_for(cached_cfg, prepare(cached_cfg, tmp_path / "cached"))
    stream_cfg = make_cfg(tmp_path, corpus, *common, "data.mode=stream", "data.preflight_sample=5")
    streamed = batches_for(stream_cfg, prepare(stream_cfg, tmp_path / "stream"))
    assert isinstance(streamed, StreamedBatches)
    want = samples(islice(cached, len(cached.plan)))
    assert sum(want.values()) == len(cached.dataset.dataset)
    assert samples(one_pass(streamed)) == want


@pytest.mark.parametrize("mode", ["cached", "stream"])
def test_truncation_that_leaves_no_target_drops_the_sample_in_both_modes(tmp_path, mode) -> None:
    """One rule for data.overlength=truncate: a sample whose targets all lie past max_seq_len is dropped and
    reported, in cached mode as in stream mode (cached mode used to keep it, stream mode dropped it)."""
    # Pre-tokenized, with no eos to lose: truncating prompt/completion formats is refused for cutting their final
    # eos (preflight's terminator check), so the rule is shown where truncation is otherwise allowed.
    rows = [
        {"input_ids": list(range(10 + i, 30 + i)), "labels": [-100] * 10 + list(range(20 + i, 30 + i))}
        for i in range(8)
    ]
    rows[3] = {"input_ids": list(range(100, 150)), "labels": [-100] * 40 + list(range(140, 150))}  # targets past 32
    corpus = write_jsonl(tmp_path / "train.jsonl", rows)
    cfg = make_cfg(
        tmp_path,
        corpus,
        "data.format=tokenized",
        "data.max_seq_len=32",
        "data.overlength=truncate",
        "data.shuffle=false",
        f"data.mode={mode}",
        "train.batch_size=1",
    )
    prepared = prepare(cfg, tmp_path / "run")
    preflight = prepared[0]
    assert preflight.splits["train"].dropped == 1 and any("keep no target" in note for note in preflight.notes)
    batches = batches_for(cfg, prepared)
    seen = samples(one_pass(batches) if mode == "stream" else islice(batches, len(batches.plan)))
    assert sum(seen.values()) == 7
    assert all(len(ids) <= 32 for ids, _ in seen)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stop_after", [1, 4, 9])  # 9: into the second pass (6 micro-batches a pass)
def test_stream_resume_yields_exactly_the_remaining_batches(tmp_path, corpus, num_workers, stop_after) -> None:
    cfg = make_cfg(
        tmp_path, corpus, "data.mode=stream", "train.batch_size=4", f"data.num_workers={num_workers}", "data.tail=pad"
    )
    prepared = prepare(cfg, tmp_path / "run")
    full = batches_for(cfg, prepared)
    assert full.batches_per_rank == 6 and full.steps_per_epoch(grad_accum=2) == 3
    expected = [rows_of(b) for b in islice(full, 14)]
    stopped = batches_for(cfg, prepared)
    taken = [rows_of(b) for b in islice(stopped, stop_after)]
    resumed = batches_for(cfg, prepared)
    resumed.load_state_dict(roundtrip(stopped.state_dict()))
    assert taken + [rows_of(b) for b in islice(resumed, 14 - stop_after)] == expected
    assert Counter(r for rows in expected[:6] for r in rows) == Counter(r for rows in expected[6:12] for r in rows)


def test_stream_tail_drop_leaves_out_what_does_not_fill_a_micro_batch_on_every_worker(tmp_path, corpus) -> None:
    """data.tail=drop is honoured in stream mode as in cached mode: 23 lines over 2 ranks x 2 workers at batch 2
    deal 5-6 lines a worker; each yields the 2 full micro-batches the smallest deal makes, the rest is left out."""
    cfg = make_cfg(tmp_path, corpus, "data.mode=stream", "train.batch_size=2", "data.num_workers=2", "data.tail=drop")
    prepared = prepare(cfg, tmp_path / "run")
    ranks = [batches_for(cfg, prepared, rank, 2) for rank in range(2)]
    passes = [one_pass(r) for r in ranks]
    assert [len(p) for p in passes] == [4, 4]
    assert all(int((b["targets"] != -100).any(dim=1).sum()) == 2 for p in passes for b in p)  # no filler


def test_stream_resume_refuses_a_changed_stream(tmp_path, corpus) -> None:
    cfg = make_cfg(tmp_path, corpus, "data.mode=stream", "train.batch_size=4")
    prepared = prepare(cfg, tmp_path / "run")
    saved = batches_for(cfg, prepared).state_dict()
    other = batches_for(cfg, prepared, 0, 2)
    with pytest.raises(DataError, match=r"train.resume.*world_size"):
        other.load_state_dict(roundtrip(saved))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_two_ranks_cover_every_line_once_with_equal_batch_counts(tmp_path, corpus, num_workers) -> None:
    cfg = make_cfg(
        tmp_path, corpus, "data.mode=stream", "train.batch_size=2", f"data.num_workers={num_workers}", "data.tail=pad"
    )
    prepared = prepare(cfg, tmp_path / "run")
    whole = samples(one_pass(batches_for(cfg, prepared)))
    ranks = [batches_for(cfg, prepared, rank, 2) for rank in range(2)]
    passes = [one_pass(r) for r in ranks]
    assert ranks[0].batches_per_rank == ranks[1].batches_per_rank == len(passes[0]) == len(passes[1])
    per_rank = [samples(p) for p in passes]
    assert not set(per_rank[0]) & set(per_rank[1])
    assert per_rank[0] + per_rank[1] == whole and sum(whole.values()) == 23


BAD = ["{broken json", '["a list"]', json.dumps({"instruction": "no output"})]


@pytest.fixture()
def dirty(tmp_path: Path) -> Path:
    """40 lines: 6 clean ones (preflight's sample), then a bad line every 8 lines (5 in all = 12.5%)."""
    rows: list = [alpaca(i) for i in range(6)]
    for i in range(6, 40):
        rows.append(BAD[i % 3] if i % 8 == 7 else alpaca(i))
    return write_jsonl(tmp_path / "dirty.jsonl", rows)


def bad_lines(path: Path) -> list[int]:
    return [n for n, line in enumerate(path.read_text().splitlines(), 1) if line in BAD]


def listed(run_dir: Path) -> list[tuple[str, int]]:
    return [(r["file"], r["line"]) for r in map(json.loads, (run_dir / "rejects.jsonl").read_text().splitlines())]


def test_stream_lists_each_bad_line_once_and_skips_it(tmp_path, dirty) -> None:
    cfg = make_cfg(
        tmp_path,
        dirty,
        "data.mode=stream",
        "data.preflight_sample=6",
        "data.max_bad_fraction=0.2",
        "train.batch_size=3",
    )
    prepared = prepare(cfg, tmp_path / "run")
    assert listed(tmp_path / "run") == []  # the sample was clean
    batches = batches_for(cfg, prepared)
    two_passes = list(islice(batches, 2 * batches.batches_per_rank))
    assert sum(samples(two_passes).values()) == 2 * (40 - 5)
    assert sorted(listed(tmp_path / "run")) == [(str(dirty), n) for n in bad_lines(dirty)]
    assert batches.state_dict()["bad_lines"] == {"lines": 80, "bad": 10}


def test_any_bad_line_fails_at_once_with_max_bad_fraction_zero(tmp_path, dirty) -> None:
    cfg = make_cfg(tmp_path, dirty, "data.mode=stream", "data.preflight_sample=6", "train.batch_size=3")
    prepared = prepare(cfg, tmp_path / "run")  # the sample is clean: preflight passes
    batches = iter(batches_for(cfg, prepared))
    with pytest.raises(
        DataError,
        match=r"1 of 10 train lines .* > data.max_bad_fraction=0.0\); the latest is \S*dirty.jsonl:8 \(not_object",
    ):
        for _ in range(3):
            next(batches)
    assert listed(tmp_path / "run") == [(str(dirty), 8)]


def test_a_nonzero_limit_is_judged_by_the_end_of_a_short_pass(tmp_path, dirty) -> None:
    # 12.5% bad: within 0.2 although the first bad line alone is 1 of 8; above 0.1 once the whole pass is read.
    cfg = make_cfg(
        tmp_path,
        dirty,
        "data.mode=stream",
        "data.preflight_sample=6",
        "data.max_bad_fraction=0.1",
        "train.batch_size=3",
    )
    prepared = prepare(cfg, tmp_path / "run")
    batches = batches_for(cfg, prepared)
    iterator = iter(batches)
    assert len(list(islice(iterator, batches.batches_per_rank))) == batches.batches_per_rank
    with pytest.raises(DataError, match=r"5 of 40 train lines .*12.50% > data.max_bad_fraction=0.1"):
        next(iterator)


# --- the global RNG ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("mode", ["cached", "stream"])
def test_batches_never_draw_from_the_global_torch_generator(tmp_path, corpus, mode, num_workers) -> None:
    """Dropout draws from torch's global generator, which a checkpoint restores. A DataLoader iterator draws its
    workers' base seed when it starts: from that generator, the resumed run (whose iterator starts right after the
    restore) would see other dropout masks than the uninterrupted one (whose iterator started at step 0)."""
    import torch

    cfg = make_cfg(tmp_path, corpus, f"data.mode={mode}", "train.batch_size=4", f"data.num_workers={num_workers}")
    prepared = prepare(cfg, tmp_path / "run")
    batches = batches_for(cfg, prepared)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    assert len(list(islice(batches, 14))) == 14  # into the third epoch / pass: three iterators started
    assert torch.equal(torch.get_rng_state(), before)


def test_eval_prompts_cut_chat_and_alpaca_samples_at_their_first_target(tmp_path):
    """A conversation's prompt runs up to its first assistant reply (the template's generation prompt included); the
    reference is that reply and its end-of-turn marker, not the later turns."""
    from seqtune.data.prompts import build_eval_prompts

    chat = write_jsonl(
        tmp_path / "chat.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": "Name a fruit."},
                    {"role": "assistant", "content": "apple"},
                    {"role": "user", "content": "Another?"},
                    {"role": "assistant", "content": "river"},
                ]
            }
        ]
        * 3,
    )
    # Three copies of one conversation, validated on itself: duplicates accepted on purpose.
    cfg = make_cfg(tmp_path, chat, f"data.val={chat}", "data.format=chat", "data.duplicates=keep")
    preflight, plan, tokenizer = prepare(cfg, tmp_path / "run")
    prompts = build_eval_prompts(
        preflight.caches["val"], count=2, max_seq_len=plan.max_seq_len, bos_id=plan.vocab.special_ids.get("bos")
    )
    assert [p.location for p in prompts] == [f"{chat}:1", f"{chat}:2"]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name a fruit."}], tokenize=False, add_generation_prompt=True
    )
    prompt = tokenizer.decode(prompts[0].prompt_ids)
    assert prompt.endswith(rendered) and "Another?" not in prompt
    assert tokenizer.decode(prompts[0].reference_ids, skip_special_tokens=True).strip() == "apple"
    # With a prompt limit below every prompt's length, nothing is left to complete.
    assert build_eval_prompts(preflight.caches["val"], count=2, max_seq_len=3, bos_id=None) == []


@pytest.mark.parametrize("sample", [0, 5])  # 0: preflight scans all; 5: the copies past it are found as written
def test_stream_drops_the_duplicates_cached_mode_drops_and_the_plan_counts_without_them(tmp_path, sample) -> None:
    rows = [alpaca(i) for i in range(20)]
    rows[3:3] = [alpaca(1)]  # line 4 repeats line 2: inside the sample
    rows[15:15] = [alpaca(7), alpaca(12)]  # lines 16 and 17 repeat lines 9 and 14: past it
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    common = ("data.shuffle=false", "train.batch_size=2", "data.tail=pad", "data.max_seq_len=64")
    cached_cfg = make_cfg(tmp_path, data, *common)
    cached = batches_for(cached_cfg, prepare(cached_cfg, tmp_path / "cached"))
    want = samples(islice(cached, len(cached.plan)))
    assert sum(want.values()) == 20 and set(want.values()) == {1}
    stream_cfg = make_cfg(tmp_path, data, *common, "data.mode=stream", f"data.preflight_sample={sample}")
    prepared = prepare(stream_cfg, tmp_path / "stream")
    assert prepared[1].stream_records == (20,)  # the plan deals the records without their copies
    streamed = batches_for(stream_cfg, prepared)
    assert streamed.batches_per_rank == 10 and streamed.identity["duplicates_dropped"] == 3
    assert samples(one_pass(streamed)) == want
    listed = [json.loads(line) for line in (tmp_path / "stream" / "rejects.jsonl").read_text().splitlines()]
    reasons = {r["line"]: r["reason"] for r in listed}
    past = "repeats {} exactly as written" if sample else "the same tokens and targets as {}"
    assert reasons == {
        4: f"duplicate: the same tokens and targets as {data}:2",
        16: "duplicate: " + past.format(f"{data}:9") + (" (past data.preflight_sample)" if sample else ""),
        17: "duplicate: " + past.format(f"{data}:14") + (" (past data.preflight_sample)" if sample else ""),
    }
    # A resume mid-pass continues the same deal: the copies stay out and nothing repeats.
    stopped = batches_for(stream_cfg, prepared)
    taken = [rows_of(b) for b in islice(stopped, 4)]
    resumed = batches_for(stream_cfg, prepared)
    resumed.load_state_dict(roundtrip(stopped.state_dict()))
    rest = [rows_of(b) for b in islice(resumed, 6)]
    assert Counter(r for rows in taken + rest for r in rows) == want
    # keep deals every record.
    kept_cfg = make_cfg(
        tmp_path, data, *common, "data.mode=stream", f"data.preflight_sample={sample}", "data.duplicates=keep"
    )
    kept = batches_for(kept_cfg, prepare(kept_cfg, tmp_path / "kept"))
    assert sum(samples(one_pass(kept)).values()) == 23
