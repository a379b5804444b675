"""Reward models as rewards (seqtune.rollout.reward_model) on tiny real checkpoints with the bundled tokenizer: the
scores are the model's own forward on the rendered text (string and message prompts, batched and right-padded),
from a directory, an hf: id in the hub cache, or a SEQ_CLS adapter on its base; what is no sequence classifier with
one label is refused naming the key; a tokenizer that cannot read the policy's tokens, message prompts without a
chat template and a model that scores NaN are preflight problems; the memory term is the loaded weights' bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

from seqtune.config.errors import ModelLoadError
from seqtune.rollout.reward_model import (
    is_reward_model_ref,
    load_reward_model,
    parameter_count,
    reward_model_problems,
)
from seqtune.tokenizers import BUNDLED_DIR
from tests.support.checkpoints import build_word_level_reward_model
from tests.support.hub_cache import add_repo

KEY = "rollout.rewards[0]"
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|' ~ m['role'] ~ '|>\n' ~ m['content'] ~ '<|end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
PROMPTS = ["Write digits: ", "Ed: only capitals\n", "x"]
COMPLETIONS = ["123 456", "ABC", "a much longer completion than the others, to pad the batch"]


def tokenizer():
    return AutoTokenizer.from_pretrained(BUNDLED_DIR)


def tiny_config(tok, **extra) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        **extra,
    )


def save(model, tok, directory: Path) -> Path:
    torch.manual_seed(0)
    model.save_pretrained(directory, safe_serialization=True)
    tok.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory) -> Path:
    tok = tokenizer()
    tok.chat_template = TEMPLATE
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(tiny_config(tok, num_labels=1))
    model.score.weight.data.normal_(0, 1.0)  # scores far apart, so a wrong read position shows
    return save(model, tok, tmp_path_factory.mktemp("rm") / "reward")


def direct(model, ids: list[int]) -> float:
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


def test_string_prompts_score_the_models_forward_on_prompt_completion_and_eos(reward_dir):
    rm = load_reward_model(KEY, str(reward_dir), device=torch.device("cpu"), dtype=torch.float32)
    scores = rm(prompts=PROMPTS, completions=COMPLETIONS, completion_ids=[[1]] * 3, kind=["a"] * 3)
    tok = tokenizer()
    model = LlamaForSequenceClassification.from_pretrained(reward_dir).eval()
    expected = [
        direct(model, tok(p + c)["input_ids"] + [tok.eos_token_id]) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)
    ]
    assert rm.tokenizer.decode(rm.render(PROMPTS[0], COMPLETIONS[0])) == "<s>Write digits: 123 456</s>"
    assert scores == pytest.approx(expected, abs=1e-5) and len(set(scores)) == 3
    assert rm.name == "reward" and not any(p.requires_grad for p in rm.model.parameters())


def test_message_prompts_score_the_chat_template_with_the_completion_as_the_assistant_turn(reward_dir):
    rm = load_reward_model(KEY, str(reward_dir), device=torch.device("cpu"), dtype=torch.float32)
    prompts = [[{"role": "user", "content": p}] for p in PROMPTS]
    completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    scores = rm(prompts=prompts, completions=completions)
    model = LlamaForSequenceClassification.from_pretrained(reward_dir).eval()
    tok = tokenizer()
    tok.chat_template = TEMPLATE
    expected = [
        direct(model, tok.apply_chat_template(p + c, tokenize=True)["input_ids"])
        for p, c in zip(prompts, completions, strict=True)
    ]
    assert scores == pytest.approx(expected, abs=1e-5)
    text = tok.decode(rm.render(prompts[1], completions[1]))
    assert text == "<s><|user|>\nEd: only capitals\n<|end|>\n<|assistant|>\nABC<|end|>\n"


def test_an_hf_id_resolves_through_the_hub_cache(reward_dir, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("SEQTUNE_USER_HF_HUB_OFFLINE", raising=False)
    add_repo(cache, "org/tiny-rm", reward_dir)
    assert is_reward_model_ref("hf:org/tiny-rm")
    rm = load_reward_model(KEY, "hf:org/tiny-rm", device=torch.device("cpu"), dtype=torch.float32)
    local = load_reward_model(KEY, str(reward_dir), device=torch.device("cpu"), dtype=torch.float32)
    assert rm.name == "tiny-rm" and rm(PROMPTS, COMPLETIONS) == local(PROMPTS, COMPLETIONS)
    with pytest.raises(
        ModelLoadError,
        match=r"rollout.rewards\[0\]=org/absent: .*not in the hub cache.*Fix: fetch it once online: `hf download org/absent`",
    ):
        load_reward_model(KEY, "hf:org/absent", device=torch.device("cpu"), dtype=torch.float32)


def test_a_seq_cls_adapter_scores_as_its_merged_model(tmp_path, monkeypatch):
    from peft import LoraConfig, get_peft_model

    tok = tokenizer()
    base = save(LlamaForCausalLM(tiny_config(tok)), tok, tmp_path / "base")
    classifier = LlamaForSequenceClassification.from_pretrained(base, num_labels=1, pad_token_id=tok.pad_token_id)
    peft = get_peft_model(classifier, LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["q_proj", "v_proj"]))
    for name, param in peft.named_parameters():
        if "lora_B" in name or "score" in name:
            param.data.normal_(0, 0.5)
    peft.save_pretrained(tmp_path / "adapter")
    tok.save_pretrained(tmp_path / "adapter")
    rm = load_reward_model(KEY, str(tmp_path / "adapter"), device=torch.device("cpu"), dtype=torch.float32)
    merged = peft.merge_and_unload().eval()
    expected = [
        direct(merged, tok(p + c)["input_ids"] + [tok.eos_token_id]) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)
    ]
    assert rm(PROMPTS, COMPLETIONS) == pytest.approx(expected, abs=1e-5)
    assert parameter_count(str(tmp_path / "adapter")) == rm.parameter_count
    # An adapter whose base is a Hub id (as peft writes it for a Hub base) loads it from the hub cache.
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("SEQTUNE_USER_HF_HUB_OFFLINE", raising=False)
    add_repo(cache, "org/tiny-base", base)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    (tmp_path / "adapter" / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": "org/tiny-base"})
    )
    on_hub = load_reward_model(KEY, str(tmp_path / "adapter"), device=torch.device("cpu"), dtype=torch.float32)
    assert on_hub(PROMPTS, COMPLETIONS) == pytest.approx(expected, abs=1e-5)


def test_a_causal_lm_directory_is_refused_naming_the_entry(tmp_path):
    tok = tokenizer()
    directory = save(LlamaForCausalLM(tiny_config(tok)), tok, tmp_path / "causal")
    with pytest.raises(
        ModelLoadError,
        match=r"rollout.rewards\[0\]=.*causal: config.json names LlamaForCausalLM, not a sequence classifier.*Fix: ",
    ):
        load_reward_model(KEY, str(directory), device=torch.device("cpu"), dtype=torch.float32)


def test_two_labels_or_no_directory_are_refused(tmp_path):
    tok = tokenizer()
    directory = save(LlamaForSequenceClassification(tiny_config(tok, num_labels=2)), tok, tmp_path / "two")
    with pytest.raises(ModelLoadError, match=r"rollout.rewards\[0\]=.*with 2 labels, not one"):
        load_reward_model(KEY, str(directory), device=torch.device("cpu"), dtype=torch.float32)
    assert is_reward_model_ref(str(tmp_path / "absent")) and not is_reward_model_ref("rewards.py:score")
    with pytest.raises(ModelLoadError, match=r"rollout.rewards\[0\]=.*absent: not a directory"):
        load_reward_model(KEY, str(tmp_path / "absent"), device=torch.device("cpu"), dtype=torch.float32)


def test_a_tokenizer_that_cannot_read_the_completions_is_a_problem(tmp_path):
    directory = build_word_level_reward_model(tmp_path / "word_level")
    rm = load_reward_model(KEY, str(directory), device=torch.device("cpu"), dtype=torch.float32)
    [(key, message)] = reward_model_problems(rm, ["write digits"], tokenizer())
    assert key == KEY and "as its unknown token '[UNK]'" in message and "Fix: " in message


def test_a_tokenizer_larger_than_the_models_embedding_is_a_problem(tmp_path):
    tok = tokenizer()
    config = tiny_config(tok, num_labels=1)
    config.vocab_size = 64  # the weights of another, smaller vocabulary
    directory = save(LlamaForSequenceClassification(config), tok, tmp_path / "small")
    rm = load_reward_model(KEY, str(directory), device=torch.device("cpu"), dtype=torch.float32)
    [(key, message)] = reward_model_problems(rm, PROMPTS[:2], tokenizer())
    assert key == KEY and "past its embedding's 64 rows" in message


def test_the_policys_own_vocabulary_reads_cleanly_and_scores_finite(reward_dir):
    rm = load_reward_model(KEY, str(reward_dir), device=torch.device("cpu"), dtype=torch.float32)
    assert reward_model_problems(rm, PROMPTS[:2], tokenizer()) == []
    assert parameter_count(str(reward_dir)) == rm.parameter_count and parameter_count("/absent/rm") == 0


def test_message_prompts_without_a_template_and_nan_scores_are_problems(tmp_path):
    tok = tokenizer()
    tok.chat_template = None
    model = LlamaForSequenceClassification(tiny_config(tok, num_labels=1))
    directory = save(model, tok, tmp_path / "plain")
    (directory / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": None}))
    rm = load_reward_model(KEY, str(directory), device=torch.device("cpu"), dtype=torch.float32)
    [(key, message)] = reward_model_problems(rm, [[{"role": "user", "content": "hi"}]], tokenizer())
    assert key == KEY and "no chat template" in message and "Fix: " in message
    rm.model.score.weight.data.fill_(float("nan"))
    [(key, message)] = reward_model_problems(rm, PROMPTS[:2], tokenizer())
    assert "dummy completions gave [nan, nan]" in message
