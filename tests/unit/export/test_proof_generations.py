"""The export proof's greedy generations per artifact: one per trained terminator (forced), the greedy continuation
with the shipped generation_config.json, and the other KV-cache setting's; the continuation stands for its own
setting's run in the cache comparison (greedy decoding is deterministic), which still fails on a difference."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from seqtune.export.facts import StopIds
from seqtune.export.proof import stops_at_terminators

EOS = 2


def _saved_model(tmp_path):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    GenerationConfig(eos_token_id=[EOS], use_cache=True).save_pretrained(tmp_path)
    return model


def _facts():
    return SimpleNamespace(stop=StopIds(bos=None, eos=(EOS,), pad=None, names={EOS: "</s>"}))


def _counting(model, calls: list[bool], *, differ_without_cache: bool = False):
    generate = model.generate

    def counted(*args, generation_config, **kwargs):
        calls.append(generation_config.use_cache)
        out = generate(*args, generation_config=generation_config, **kwargs)
        if differ_without_cache and not generation_config.use_cache:
            out = out.clone()
            out[0, -1] = (out[0, -1] + 1) % 64
        return out

    model.generate = counted


def test_each_artifact_generates_greedily_once_per_cache_setting(tmp_path):
    model = _saved_model(tmp_path)
    calls: list[bool] = []
    _counting(model, calls)
    prompt = torch.tensor([5, 6, 7, 8])
    checks, failures = stops_at_terminators(model, tmp_path, _facts(), prompt, torch.device("cpu"))
    # one forced stop per terminator, the shipped config's greedy run (with the cache), the cache-free run
    assert calls == [True, True, False]
    assert not failures and checks["cache_same_tokens"] is True and checks["stops"] == {"</s>": True}
    config = GenerationConfig.from_pretrained(tmp_path)
    config.do_sample, config.max_new_tokens, config.use_cache = False, 16, False
    without_cache = model.generate(input_ids=prompt[None], generation_config=config)[0, 4:].tolist()
    assert checks["greedy"] == without_cache


def test_greedy_tokens_that_differ_without_the_cache_still_fail_the_proof(tmp_path):
    model = _saved_model(tmp_path)
    _counting(model, [], differ_without_cache=True)
    checks, failures = stops_at_terminators(model, tmp_path, _facts(), torch.tensor([5, 6, 7, 8]), torch.device("cpu"))
    assert checks["cache_same_tokens"] is False
    assert any("differs from generation without it" in failure for failure in failures)
