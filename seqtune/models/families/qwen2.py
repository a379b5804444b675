"""Qwen2 / Qwen2.5 (dense): Qwen2ForCausalLM with GQA, biases on q/k/v only, no bos, ChatML turns.

Quirks: q_proj, k_proj and v_proj always carry a bias (Qwen2Attention builds them with bias=True, o_proj and the MLP
without; no config flag switches it), so the written-down layout says so; GQA (0.5B: 14 query / 2 key-value heads,
7B: 28 / 4); RoPE theta 1e6, 32768-token context; tied embeddings in the small models (0.5B, 1.5B, 3B), untied from
7B up; a sliding window in config.json that use_sliding_window=false turns off; the tokenizer has no bos and ends an
assistant turn with <|im_end|>; the chat template gives a default system message when the data has none.

The worked example of docs/extending.md "Adding a model family": this module and
seqtune/configs/model/qwen2_tiny.yaml are all of it (no list, table or test edited elsewhere).
"""

from __future__ import annotations

from typing import Any

from seqtune.models.spec import (
    FAMILY_SPECS,
    GgufRow,
    Layout,
    ModelSpec,
    TestExpectations,
    common_arch_fields,
    decoder_config_kwargs,
)

# Qwen2.5-Instruct's chat template (tokenizer_config.json of Qwen/Qwen2.5-0.5B-Instruct), written compactly: ChatML,
# the default system message when the conversation has none, tool definitions in the system turn, tool calls as
# <tool_call>{json}</tool_call>, tool results as <tool_response> blocks in one user turn.
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- '" + DEFAULT_SYSTEM + "' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' or (message['role'] == 'system' and not loop.first) or "
    "(message['role'] == 'assistant' and not message['tool_calls']) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- if call['function'] is defined %}{%- set call = call['function'] %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' + call['arguments'] | tojson }}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def gguf_refusal(config: dict) -> str | None:
    """What llama.cpp's qwen2 loader cannot hold: it sizes the attention by hidden_size alone (attn_q is
    hidden x hidden whatever key_length says), so a head_dim x heads other than hidden_size loads nowhere ("tensor
    'blk.0.attn_q.weight' has wrong shape"). Every Qwen2/2.5 release has head_dim = hidden / heads."""
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // heads
    if head_dim * heads == hidden:
        return None
    return (
        f"head_dim {head_dim} x num_attention_heads {heads} != hidden_size {hidden} (llama.cpp's qwen2 sizes its "
        "attention by hidden_size)"
    )


def tiny_config_kwargs(f: dict[str, Any]) -> dict[str, Any]:
    # bos_token_id: as the real checkpoints' tokenizer, no bos.
    return decoder_config_kwargs(f, rms_norm_eps=1e-6, use_sliding_window=False, bos_token_id=None)


SPEC = ModelSpec(
    family="qwen2",
    hf_model_types=("qwen2",),
    hf_model_class="Qwen2ForCausalLM",
    padding_side="right",
    chat_template=CHAT_TEMPLATE,
    eot_token="<|im_end|>",
    unused_fields=frozenset({"sliding_window", "sliding_window_pattern", "rope_scaling_factor"}),
    liger=True,
    tiny_defaults={
        # The real rows (151936: the 151665-token vocabulary padded), so a Qwen tokenizer needs no resize.
        "vocab_size": 151936,
        "hidden_size": 64,
        "intermediate_size": 224,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        # hidden / heads, stated: Qwen2Attention reads config.head_dim and would not replace an explicit null.
        "head_dim": 16,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    hf_config_class="Qwen2Config",
    tiny_config_kwargs=tiny_config_kwargs,
    read_arch_fields=common_arch_fields,
    # Biases on q/k/v only, always: no flag in config.json says it.
    layout=Layout(biases=dict.fromkeys(("q_proj", "k_proj", "v_proj"), True)),
    # convert_hf_to_gguf.py's Qwen2Model: llama.cpp's qwen2 architecture (its q/k/v bias tensors included).
    gguf=GgufRow(name="QWEN2", refusal=gguf_refusal),
    tests=TestExpectations(
        tokenizer="qwen3",  # the same byte-level BPE and ChatML tokens (Qwen3's adds <think> tokens)
        bos_eos=(None, "<|im_end|>"),
        chat_markers=(
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
            "<|im_start|>assistant\nHello<|im_end|>\n",
        ),
    ),
)

FAMILY_SPECS.register(SPEC)
