"""Each preflight check fails on a broken invariant and passes on a sound one, on plain values."""

from __future__ import annotations

import numpy as np
import pytest

from seqtune.data.formats import record_format, reject_fixes
from seqtune.data.types import Reject
from seqtune.models.spec import resized_rows
from seqtune.preflight import checks

CHECKPOINT = checks.VocabFix(can_resize=True, tiny=False)


def test_vocab_size_fails_when_tokenizer_is_bigger_than_the_embedding():
    problems = checks.check_vocab_size(
        tokenizer_size=4097, embedding_rows=4096, output_rows=4096, resize_embeddings=False, fix=CHECKPOINT
    )
    assert [p.key for p in problems] == ["model.resize_embeddings"]  # one cause, one problem
    assert "4097" in problems[0].message
    assert "input embedding rows 4096 and output head rows 4096" in problems[0].message
    assert "model.resize_embeddings=true (resizes to 4160)" in problems[0].message


def test_vocab_size_counts_the_special_tokens_it_leaves_without_a_row():
    specials = {"bos": 1, **{f"<|reserved_{i}|>": 4096 + i for i in range(256)}}
    problems = checks.check_vocab_size(
        tokenizer_size=4352,
        embedding_rows=4096,
        output_rows=4096,
        resize_embeddings=False,
        fix=CHECKPOINT,
        special_ids=specials,
    )
    assert len(problems) == 1
    assert "256 special token(s) among them: <|reserved_0|> (4096), " in problems[0].message
    assert "and 251 more" in problems[0].message


@pytest.mark.parametrize("size, resize", [(4096, False), (4000, False), (4097, True)])
def test_vocab_size_passes_when_it_fits_or_resizes(size, resize):
    assert (
        checks.check_vocab_size(
            tokenizer_size=size, embedding_rows=4096, output_rows=4096, resize_embeddings=resize, fix=CHECKPOINT
        )
        == []
    )


def test_resized_rows_are_a_multiple_of_64_and_never_fewer():
    assert resized_rows(4096, 4097) == 4160
    assert resized_rows(4096, 4096) == 4096
    assert resized_rows(8192, 4097) == 8192


def test_special_token_out_of_range_fails_in_range_passes():
    problems = checks.check_special_token_ids(
        special_ids={"bos": 1, "pad": 4096, "eos": None, "x": 5000}, vocab_rows=4096, fix=CHECKPOINT
    )
    assert len(problems) == 1 and "2 special token(s)" in problems[0].message
    assert "pad (4096), x (5000)" in problems[0].message
    assert checks.check_special_token_ids(special_ids={"bos": 1, "pad": 4095}, vocab_rows=4096, fix=CHECKPOINT) == []


def test_max_token_id_names_file_and_line():
    problems = checks.check_max_token_id(
        split="train", max_token_id=32000, location="train.jsonl:7", vocab_rows=4096, pretokenized=True, fix=CHECKPOINT
    )
    assert problems[0].location == "train.jsonl:7" and problems[0].key == "data.train"
    assert "32000 (train.jsonl:7) >= model embedding rows 4096" in problems[0].message
    assert (
        checks.check_max_token_id(
            split="train",
            max_token_id=4095,
            location="train.jsonl:7",
            vocab_rows=4096,
            pretokenized=False,
            fix=CHECKPOINT,
        )
        == []
    )


def test_pad_eq_eos_is_only_a_note():
    assert "masked" in checks.pad_token_notes(pad_id=2, eos_id=2)[0]
    assert checks.pad_token_notes(pad_id=3, eos_id=2) == []


def test_auto_length_following_one_outlier_is_called_out_with_the_fixed_length_that_fits():
    lengths = np.array([18, 20, 21] * 100 + [4057])
    [note] = checks.auto_length_notes(lengths=lengths, max_seq_len=4064, longest_location="t.jsonl:301")
    assert "data.max_seq_len=auto is 4064, set by the longest sample (4057 tokens, t.jsonl:301)" in note
    assert "99% of samples have at most 21 tokens and 1 sample(s) exceed 24" in note
    assert "data.max_seq_len=24 data.overlength=drop (drops those 1)" in note
    assert (
        checks.auto_length_notes(
            lengths=np.array([18, 20, 21] * 100 + [42]), max_seq_len=48, longest_location="t.jsonl:301"
        )
        == []
    )


def test_resolve_max_seq_len_auto_rounds_up_to_8():
    assert checks.resolve_max_seq_len("auto", 473) == 480
    assert checks.resolve_max_seq_len("auto", 480) == 480
    assert checks.resolve_max_seq_len(466, 473) == 466


def test_context_length_is_never_silently_raised():
    explicit = checks.check_context_length(max_seq_len=4096, context_length=2048, auto=False)
    assert "data.max_seq_len=4096 > model context length 2048" in explicit[0].message
    auto = checks.check_context_length(
        max_seq_len=4096, context_length=2048, auto=True, longest_location="train.jsonl:3"
    )
    assert "auto resolves to 4096" in auto[0].message and auto[0].location == "train.jsonl:3"
    assert checks.check_context_length(max_seq_len=2048, context_length=2048, auto=False) == []


def test_overlength_lists_the_longest_offender_first_and_counts_the_rest():
    lengths = np.array([10, 473, 470, 5, 468, 469, 467, 471, 472])
    locations = [f"val.jsonl:{i + 1}" for i in range(len(lengths))]
    problems = checks.check_overlength(
        split="val", lengths=lengths, locations=locations, max_seq_len=466, policy="error"
    )
    message = problems[0].message
    assert message.startswith("data.max_seq_len=466 < longest val sample 473 tokens (val.jsonl:2)")
    assert "val.jsonl:2 (473 tokens > 466)" in message and "and 2 more" in message
    assert "Fix: data.max_seq_len=auto, or data.overlength=truncate" in message
    assert problems[0].location == "val.jsonl:2"


@pytest.mark.parametrize("policy", ["truncate", "drop"])
def test_overlength_with_an_explicit_policy_or_short_data_passes(policy):
    lengths = np.array([10, 473])
    assert (
        checks.check_overlength(split="val", lengths=lengths, locations=["a:1", "a:2"], max_seq_len=466, policy=policy)
        == []
    )
    assert (
        checks.check_overlength(split="val", lengths=lengths, locations=["a:1", "a:2"], max_seq_len=480, policy="error")
        == []
    )


def test_length_stats():
    stats = checks.length_stats(np.arange(1, 101), 90)
    assert stats == {"min": 1, "median": 50, "p99": 100, "max": 100, "over_limit": 10}
    assert checks.length_stats(np.array([], dtype=np.int64), 8)["max"] == 0


def test_zero_trainable_tokens_fail_unless_dropped():
    problems = checks.check_trainable_tokens(split="train", zero_target=7, locations=["t:2", "t:5"], dropped=False)
    assert problems[0].location == "t:2"
    assert "7 train sample(s) have zero trainable tokens" in problems[0].message and "and 5 more" in problems[0].message
    assert checks.check_trainable_tokens(split="train", zero_target=7, locations=["t:2"], dropped=True) == []
    assert checks.check_trainable_tokens(split="train", zero_target=0, locations=[], dropped=False) == []
    assert checks.trainable_fraction(np.array([1, 1]), np.array([2, 2])) == 0.5


def test_batch_shapes_mismatch_fails():
    problems = checks.check_batch_shapes(
        label="longest batch",
        strategy="longest",
        expected=(3, 4096),
        shapes={"input_ids": (3, 4096), "targets": (3, 3999)},
    )
    assert "must give the longest batch the shape [3, 4096]" in problems[0].message
    assert "targets [3, 3999]" in problems[0].message


def test_every_strategy_must_give_the_shape_its_rule_gives():
    wrong = checks.check_batch_shapes(
        label="shortest batch", strategy="max_length", expected=(4, 64), shapes={"input_ids": (4, 12), "num_tokens": ()}
    )
    assert "shape [4, 64]" in wrong[0].message and "input_ids [4, 12]" in wrong[0].message
    assert (
        checks.check_batch_shapes(
            label="b", strategy="max_length", expected=(4, 64), shapes={"input_ids": (4, 64), "attention_mask": (4, 64)}
        )
        == []
    )
    fewer_rows = checks.check_batch_shapes(
        label="packed batch", strategy="packed", expected=(2, 64), shapes={"input_ids": (1, 64)}
    )
    assert "shape [2, 64]" in fewer_rows[0].message
    assert (
        checks.check_batch_shapes(label="b", strategy="packed", expected=(2, 64), shapes={"input_ids": (2, 64)}) == []
    )


def test_packed_needs_an_attention_backend_that_separates_documents():
    assert (
        checks.check_packed_attention(strategy="packed", attn_implementation="flex_attention")[0].key
        == "model.attn_implementation"
    )
    for backend in ("flash_attention_2", "sdpa", "eager"):
        assert checks.check_packed_attention(strategy="packed", attn_implementation=backend) == []
    assert checks.check_packed_attention(strategy="longest", attn_implementation="flex_attention") == []


def test_prepadded_rows_are_reported():
    notes = checks.prepadded_notes(split="train", count=2, locations=["t.jsonl:1", "t.jsonl:3"], strategy="longest")
    assert "2 pre-tokenized train row(s) arrived already padded (first: t.jsonl:1, t.jsonl:3)" in notes[0]
    assert checks.prepadded_notes(split="train", count=0, locations=[], strategy="longest") == []


def _rejects(n):
    return [Reject(file="train.jsonl", line=i + 1, reason="bad_json: Expecting value") for i in range(n)]


def test_bad_lines_fail_at_zero_fraction_and_pass_with_a_higher_one():
    rejects = _rejects(2) + [Reject(file="train.jsonl", line=9, reason="missing_media: img/a.png")]
    problems = checks.check_bad_lines(split="train", rejects=rejects, total_lines=10, max_bad_fraction=0.0)
    message = problems[0].message
    assert "3 of 10 train lines are malformed" in message and "bad_json x2, missing_media x1" in message
    assert "train.jsonl:9 (missing_media: img/a.png)" in message and "data.max_bad_fraction=0.3" in message
    assert checks.check_bad_lines(split="train", rejects=rejects, total_lines=10, max_bad_fraction=0.3) == []
    assert checks.reject_counts(rejects) == {"bad_json": 2, "missing_media": 1}


def test_conversations_the_template_cannot_render_name_the_template_not_the_data():
    tool = (
        "template_rejected: messages[2] role 'tool' is not accepted by the chat template "
        "(tokenizer.chat_template), which takes: system, user, assistant"
    )
    rejects = [Reject(file="c.jsonl", line=i, reason=tool) for i in (3, 4, 8)] + _rejects(1)
    problems = checks.check_bad_lines(split="train", rejects=rejects, total_lines=10, max_bad_fraction=0.1)
    assert [(p.check, p.key, p.location) for p in problems] == [
        ("template", "tokenizer.chat_template", "c.jsonl:3"),
        ("integrity", "data.max_bad_fraction", "train.jsonl:1"),
    ]
    template = problems[0].message
    assert "3 of 10 train conversations cannot be rendered by the chat template" in template
    assert f"c.jsonl:3 ({tool})" in template and "(tool turns: llama3, mistral_v3, qwen3, qwen3_no_think;" in template
    assert "Fix: tokenizer.chat_template=NAME" in template and "data.max_bad_fraction=0.4 to skip them" in template
    assert "1 of 10 train lines are malformed" in problems[1].message


def test_overlength_drops_are_a_policy_not_bad_lines():
    dropped = [Reject(file="t", line=1, reason="overlength: 600 tokens > 512")]
    assert checks.check_bad_lines(split="train", rejects=dropped, total_lines=2, max_bad_fraction=0.0) == []


def test_lines_the_chat_template_refuses_blame_the_template_key():
    refused = [
        Reject(file="c.jsonl", line=n, reason="template_rejected: ... Conversation roles must alternate")
        for n in range(1, 4)
    ]
    [problem] = checks.check_bad_lines(split="train", rejects=refused, total_lines=5, max_bad_fraction=0.0)
    assert problem.key == "tokenizer.chat_template" and "cannot be rendered by the chat template" in problem.message
    # Mixed with malformed lines: the template's share is still its own problem, the data's another.
    mixed = refused + [Reject(file="c.jsonl", line=4, reason="bad_json: x")]
    problems = checks.check_bad_lines(split="train", rejects=mixed, total_lines=5, max_bad_fraction=0.0)
    assert [p.key for p in problems] == ["tokenizer.chat_template", "data.max_bad_fraction"]


def test_an_empty_split_is_a_problem_naming_its_key():
    common = {"files": ["v.jsonl"], "reject_counts": {}, "first_reject": None, "overlength": "error"}
    [empty] = checks.check_split_not_empty(split="val", records=0, samples=0, kept=0, **common)
    assert empty.key == "data.val" and "v.jsonl hold(s) nothing but blank lines" in empty.message
    assert "data.val=null" in empty.message
    first = Reject(file="t.jsonl", line=2, reason="bad_json: x")
    [rejected] = checks.check_split_not_empty(
        split="train",
        records=3,
        samples=0,
        kept=0,
        files=["t.jsonl"],
        reject_counts={"bad_json": 3},
        first_reject=first,
        overlength="error",
    )
    assert rejected.key == "data.train" and rejected.location == "t.jsonl:2"
    assert "all 3 were rejected, most for bad_json (3 of 3)" in rejected.message and "=null" not in rejected.message
    # The most common reason names its own key and fix (not data.max_bad_fraction, which cannot help).
    rejects = [Reject(file="t.jsonl", line=1, reason="bad_json: x")] + [
        Reject(file="t.jsonl", line=n, reason="missing_field: output (has: instruction, response)") for n in (2, 3)
    ]
    [mapped] = checks.check_split_not_empty(
        split="train",
        records=3,
        samples=0,
        kept=0,
        files=["t.jsonl"],
        reject_counts={"bad_json": 1, "missing_field": 2},
        first_reject=rejects[0],
        overlength="error",
        rejects=rejects,
        reject_fixes=reject_fixes([record_format("alpaca")]),
    )
    assert (mapped.key, mapped.location) == ("data.columns", "t.jsonl:2")
    assert "most for missing_field (2 of 3; also bad_json x1)" in mapped.message
    assert (
        "Fix: name the data's fields with data.columns=" in mapped.message and "max_bad_fraction" not in mapped.message
    )
    [dropped] = checks.check_split_not_empty(
        split="train",
        records=3,
        samples=3,
        kept=0,
        files=["t.jsonl"],
        reject_counts={},
        first_reject=None,
        overlength="drop",
    )
    assert dropped.key == "data.overlength" and "all 3 are longer than data.max_seq_len" in dropped.message
    assert checks.check_split_not_empty(split="train", records=3, samples=3, kept=1, **common) == []


def test_epoch_with_zero_steps_fails():
    problems = checks.check_epoch_steps(
        split="train",
        num_items=6,
        micro_batches_per_rank=0,
        steps_per_epoch=0,
        batch_size=4,
        world_size=2,
        grad_accum=1,
    )
    assert "zero micro-batches" in problems[0].message and "= 8" in problems[0].message
    no_step = checks.check_epoch_steps(
        split="train",
        num_items=8,
        micro_batches_per_rank=1,
        steps_per_epoch=0,
        batch_size=4,
        world_size=2,
        grad_accum=2,
    )
    assert "zero optimizer steps" in no_step[0].message and "train.grad_accum=2 = 16" in no_step[0].message
    assert (
        checks.check_epoch_steps(
            split="val",
            num_items=8,
            micro_batches_per_rank=1,
            steps_per_epoch=None,
            batch_size=4,
            world_size=2,
            grad_accum=2,
        )
        == []
    )


def test_lora_targets_must_match_a_module():
    names = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj", "model.layers.0.mlp.up_proj"]
    problems = checks.check_lora_targets(targets=["q_proj", "query"], module_names=names, defaults=["q_proj", "v_proj"])
    assert "['query'] match no module" in problems[0].message and "q_proj, up_proj, v_proj" in problems[0].message
    assert "lora.target_modules=null (the family's defaults: ['q_proj', 'v_proj'])" in problems[0].message
    assert checks.check_lora_targets(targets=["q_proj", "v_proj"], module_names=names, defaults=[]) == []
    # A full path matches too (peft's suffix rule); no targets = full fine-tuning, nothing to check.
    assert checks.check_lora_targets(targets=["layers.0.mlp.up_proj"], module_names=names, defaults=[]) == []
    assert checks.check_lora_targets(targets=[], module_names=names, defaults=[]) == []


def test_qlora_needs_cuda_and_bitsandbytes():
    problems = checks.check_backend(
        load_in_4bit=True, device="auto", cuda_available=False, bitsandbytes_installed=True, attention_problems=[]
    )
    assert [p.key for p in problems] == ["model.load_in_4bit"] and "needs a CUDA device" in problems[0].message
    missing = checks.check_backend(
        load_in_4bit=True, device="auto", cuda_available=True, bitsandbytes_installed=False, attention_problems=[]
    )
    assert "needs bitsandbytes" in missing[0].message
    assert (
        checks.check_backend(
            load_in_4bit=True, device="auto", cuda_available=True, bitsandbytes_installed=True, attention_problems=[]
        )
        == []
    )


def test_attention_problems_come_from_the_attention_rule_and_device_is_checked():
    problems = checks.check_backend(
        load_in_4bit=False,
        device="cuda",
        cuda_available=False,
        bitsandbytes_installed=False,
        attention_problems=["model.attn_implementation=torch_varlen needs a CUDA device"],
    )
    assert [p.key for p in problems] == ["train.device", "model.attn_implementation"]
    assert problems[1].message == "model.attn_implementation=torch_varlen needs a CUDA device"


def test_memory_fails_only_against_a_known_device():
    problems = checks.check_memory(
        estimate_gib=90.0,
        device_memory_gib=80.0,
        breakdown="weights 60",
        fits=["model.gradient_checkpointing=true (~40.0 GiB)"],
    )
    assert "90.0 GiB (weights 60) > device memory 80.0 GiB" in problems[0].message
    assert problems[0].message.endswith(
        "Fix: one of (each with its estimated peak) model.gradient_checkpointing=true (~40.0 GiB)."
    )
    none = checks.check_memory(estimate_gib=90.0, device_memory_gib=80.0, breakdown="")[0].message
    assert "alone or up to three together: use train.parallel=fsdp over more GPUs" in none
    assert checks.check_memory(estimate_gib=90.0, device_memory_gib=None, breakdown="") == []
    assert checks.check_memory(estimate_gib=9.0, device_memory_gib=80.0, breakdown="") == []


def test_a_reference_copy_under_fsdp_is_refused_with_fixes_that_are_accepted():
    from seqtune.config.recipe_spec import recipe_spec

    dpo = recipe_spec("dpo")
    [problem] = checks.check_reference_model(reference="copy", sharded=True, recipe=dpo)
    assert problem.key == "train.parallel" and "recipe_name=dpo" in problem.message
    assert "recipe=lora_dpo train.parallel=ddp" in problem.message and "dpo.loss=simpo" in problem.message
    assert checks.check_reference_model(reference="adapters", sharded=True, recipe=dpo) == []
    assert checks.check_reference_model(reference="none", sharded=True, recipe=dpo) == []
    assert checks.check_reference_model(reference="copy", sharded=False, recipe=dpo) == []
