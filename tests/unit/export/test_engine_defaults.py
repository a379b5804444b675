"""What both serving engines (seqtune.export.engine's Engine and engine_gguf's GgufEngine) share: the default
sampling read from the run's generation_config.json, and how a conversation becomes token ids."""

from __future__ import annotations

from transformers import GenerationConfig

from seqtune.export.engine import Engine, RunTokenizer, Sampling, generation_defaults
from seqtune.export.engine_gguf import GgufEngine
from tests.support.data import load_bundled_tokenizer


def test_the_default_sampling_is_greedy_unless_the_generation_config_samples():
    assert generation_defaults(GenerationConfig()) == Sampling(max_tokens=256, temperature=0.0, top_p=1.0)
    greedy = GenerationConfig(max_new_tokens=32, temperature=0.7, top_p=0.9)  # do_sample off: its values unused
    assert generation_defaults(greedy) == Sampling(max_tokens=32, temperature=0.0, top_p=1.0)
    sampled = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.9, max_new_tokens=32)
    assert generation_defaults(sampled) == Sampling(max_tokens=32, temperature=0.7, top_p=0.9)


def test_both_engines_render_a_conversation_with_the_template_and_add_no_bos_again():
    assert issubclass(Engine, RunTokenizer) and issubclass(GgufEngine, RunTokenizer)
    served = RunTokenizer()
    served.tokenizer = load_bundled_tokenizer()  # its template writes <s>; the tokenizer itself would add one too
    ids = served.chat_ids([{"role": "user", "content": "Hi"}])
    assert served.tokenizer.decode(ids) == "<s><|user|>\nHi<|end|>\n<|assistant|>\n"
    assert ids.count(served.tokenizer.bos_token_id) == 1 and served.text_ids("x") == [95]
