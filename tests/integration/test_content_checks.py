"""Preflight's second wave through the real CLI, on the real Llama 3 and Mistral tokenizers: a local checkpoint
directory built here (config.json, generation_config.json, safetensors with planted zero rows) and chat data with
the mistakes users report; each broken setup exits 2 naming the key, file:line and the fix, and the fixed setup
trains. samples.html is in the run directory either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import REPO, read_metrics, run_cli

pytestmark = pytest.mark.slow  # runs the real CLI end to end (the fast subset: -m "not slow")

EOT, START, END = 128009, 128006, 128007
TRAIN_BRIEFLY = ["train.max_steps=1", "train.eval_every=0", "train.batch_size=2"]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def chat(i: int, reply: str | None = None) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"What is {i} plus {i}?"},
            {"role": "assistant", "content": reply or f"It is {2 * i}."},
            {"role": "user", "content": "Thanks."},
            {"role": "assistant", "content": "Any time."},
        ]
    }


def exit_2(result, run_dir: Path, *needles: str) -> str:
    """Exit 2, nothing trained; every needle is in the closing summary or in a problem's (unwrapped) message."""
    text = result.stdout + result.stderr
    assert result.returncode == 2, text[-4000:]
    problems = json.loads((run_dir / "preflight.json").read_text())["problems"]
    text += "\n".join(p["message"] for p in problems)
    for needle in needles:
        assert needle in text, f"{needle!r} not in output:\n{text[-6000:]}"
    assert (run_dir / "samples.html").is_file() and not (run_dir / "adapter").exists()
    return text


def trained(result, run_dir: Path) -> None:
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert [m for m in read_metrics(run_dir) if "loss" in m]
    assert (run_dir / "samples.html").is_file() and (run_dir / "adapter" / "adapter_model.safetensors").is_file()


@pytest.fixture(scope="module")
def llama3_checkpoint(tmp_path_factory) -> Path:
    """A tiny Llama-3-shaped checkpoint with the real Llama 3 tokenizer (its tokenizer.json presetting truncation),
    whose chat-token rows were never trained (zero, as in the base model) and whose generation stops on eos only."""
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from seqtune.config.schema import ModelConfig
    from seqtune.models import build_model
    from seqtune.tokenizers.pypi import tokenizer_dir

    path = tmp_path_factory.mktemp("ckpt") / "Llama-3-tiny"
    shape = {
        "vocab_size": 128256,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_layers": 1,
        "num_heads": 2,
        "num_kv_heads": 1,
    }
    cfg = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(ModelConfig), OmegaConf.load(REPO / "seqtune/configs/model/llama3_tiny.yaml"), shape
        )
    )
    model = build_model(cfg, attn_implementation="sdpa")
    with torch.no_grad():
        for token in (START, END, EOT):
            model.model.embed_tokens.weight[token] = 0
            model.lm_head.weight[token] = 0
    model.config.bos_token_id, model.config.eos_token_id = 128000, 128001
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 128000, "eos_token_id": 128001}))
    AutoTokenizer.from_pretrained(tokenizer_dir("llama3")).save_pretrained(path)
    tokenizer_json = json.loads((path / "tokenizer.json").read_text())
    tokenizer_json["truncation"] = {"direction": "Right", "max_length": 16, "strategy": "LongestFirst", "stride": 0}
    (path / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    return path


def test_a_llama3_checkpoint_broken_setup_exits_2_and_the_fixed_setup_trains(llama3_checkpoint, tmp_path):
    ckpt = llama3_checkpoint
    train_rows = [chat(i) for i in range(7)] + [chat(7, reply="It is 14.<|eot_id|> Done.")]
    train = write_jsonl(tmp_path / "train.jsonl", train_rows)
    val = write_jsonl(tmp_path / "val.jsonl", [chat(20), chat(3)])  # line 2 is train line 4
    common = [
        "model=llama3_8b",
        f"model.path={ckpt}",
        "lora=default",
        f"data.train={train}",
        f"data.val={val}",
        "data.format=chat",
        "model.dtype=float32",
    ]
    # 7: a config that states an 8192-token pretraining context and no RoPE scaling to stretch it.
    config = json.loads((ckpt / "config.json").read_text())
    scaled = config["rope_parameters"]
    config.update(
        rope_parameters={"rope_type": "default", "rope_theta": scaled["rope_theta"]},
        original_max_position_embeddings=8192,
    )
    (ckpt / "config.json").write_text(json.dumps(config))
    failing = tmp_path / "failing"
    text = exit_2(
        run_cli([*common, "data.max_seq_len=9000", "preflight.only=true"], failing),
        failing,
        "[length] data.max_seq_len",
        "data.max_seq_len=9000 > the model's pretraining context 8192",
        "Fix: data.max_seq_len=8192",
        # 5: the tokenizer.json that would cut every text at 16 tokens
        "[tokenizer] model.path",
        f'set "truncation": null and "padding": null in {ckpt}/tokenizer.json',
        # 4: a literal <|eot_id|> inside a reply
        f"[specials] data.train ({train}:8)",
        "<|eot_id|> in 1 line(s)",
        # 8: a validation conversation that is also a training one
        f"[duplicates] data.duplicates ({val}:2)",
        f"{val}:2 (= {train}:4)",
        # 2: the trained end-of-turn is not a token generation stops on
        "[stopping] model.path",
        f'set "eos_token_id": [128001, 128009] in {ckpt}/generation_config.json',
        # 3: the chat tokens' rows are zero and would stay frozen
        "[untrained] lora.modules_to_save",
        "<|eot_id|> (id 128009): all zero",
        "Fix: lora.modules_to_save=[embed_tokens,lm_head]",
    )
    report = json.loads((failing / "preflight.json").read_text())
    content = report["splits"]["train"]["content"]
    assert content["trained_terminators"]["<|eot_id|>"] >= 8 and content["literal_special_lines"] == 1
    assert report["splits"]["val"]["content"]["duplicates_of_train"] == 1
    assert "Fix:" in text

    # The fixes, each as the messages name them.
    config.update(rope_parameters=scaled)
    del config["original_max_position_embeddings"]
    (ckpt / "config.json").write_text(json.dumps(config))
    (ckpt / "generation_config.json").write_text(json.dumps({"bos_token_id": 128000, "eos_token_id": [128001, EOT]}))
    tokenizer_json = json.loads((ckpt / "tokenizer.json").read_text())
    tokenizer_json["truncation"] = None
    (ckpt / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    write_jsonl(train, train_rows[:7] + [chat(7)])
    run_dir = tmp_path / "run"
    trained(
        run_cli(
            [*common, "lora.modules_to_save=[embed_tokens,lm_head]", "data.duplicates=keep", *TRAIN_BRIEFLY],
            run_dir,
        ),
        run_dir,
    )
    report = json.loads((run_dir / "preflight.json").read_text())
    assert report["ok"] and report["splits"]["train"]["content"]["masked_terminators"] == 0


MASKING_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if not loop.first %}{{ eos_token }}{% endif %}"
    "{{ m['role'] + ': ' + m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}{{ eos_token }}{{ 'assistant: ' }}{% endif %}"
)


def test_mistral_a_template_masking_eos_and_truncation_cutting_it_exit_2_and_the_fixes_train(tmp_path):
    # Over 48 tokens with its reply starting before token 48: truncate keeps part of the reply and cuts its </s>
    # (a reply cut away entirely is dropped instead); truncate_prompt keeps the whole reply.
    long_prompt = {
        "messages": [
            {"role": "user", "content": "Please repeat: " + "alpha beta gamma " * 8},
            {"role": "assistant", "content": "alpha beta gamma " * 4},
        ]
    }
    train = write_jsonl(tmp_path / "train.jsonl", [chat(i) for i in range(6)] + [long_prompt])
    common = [
        "model=mistral_tiny",
        "model.vocab_size=32768",
        "tokenizer=mistral_v3",
        f"data.train={train}",
        "data.val=null",
        "data.format=chat",
        "data.max_seq_len=48",
    ]
    failing = tmp_path / "failing"
    exit_2(
        run_cli(
            [
                *common,
                f'tokenizer.chat_template="{MASKING_TEMPLATE}"',
                "data.overlength=truncate",
                "preflight.only=true",
            ],
            failing,
        ),
        failing,
        # 1: the template renders each reply's </s> at the start of the next turn: never a target
        f"[terminator] tokenizer.chat_template ({train}:1)",
        "followed by their terminator </s> (id 2)",
        "Fix: tokenizer.chat_template=null",
        # 6: truncate cuts the long sample's final </s>
        f"[truncation] data.overlength ({train}:7)",
        "Fix: data.overlength=truncate_prompt",
    )
    run_dir = tmp_path / "run"
    trained(run_cli([*common, "data.overlength=truncate_prompt", *TRAIN_BRIEFLY], run_dir), run_dir)
    report = json.loads((run_dir / "preflight.json").read_text())
    assert report["splits"]["train"]["truncated"] == 1 and report["splits"]["train"]["content"]["terminator_cut"] == 0
