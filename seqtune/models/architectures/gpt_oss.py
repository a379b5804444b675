"""gpt-oss (GptOssForCausalLM: gpt-oss-20b, gpt-oss-120b): no named family; it trains with model=hf, its facts read
from the checkpoint (config.json layer_types alternating sliding_attention and full_attention, num_local_experts and
num_experts_per_tok, router_aux_loss_coef: the router's load-balancing loss, as for the other mixtures of experts).
Its experts are fused 3-D parameters with biases (mlp.experts.gate_up_proj [experts, hidden, 2 x intermediate],
down_proj), its router a biased top-k (mlp.router), so LoRA adapts attention by default (lora.target_parameters
reaches the experts). The release stores the experts in MXFP4 (seqtune.models.quantized).

What seqtune states of it:
- its attention: every head adds a learned sink logit (self_attn.sinks) to each softmax's denominator. transformers'
  eager path computes it; the class declares no sdpa (transformers refuses sdpa for it); its flash path takes the
  sinks only through hub kernels (vllm-flash-attn3, which transformers would fetch in place of flash_attention_2);
  seqtune's torch_varlen kernel has no sink. So eager is the one implementation seqtune runs it with, and auto
  picks it.
- no GGUF row: llama.cpp's gpt-oss needs the sinks, the experts' biases, the interleaved gate/up split and YaRN
  scaling, none of which seqtune's GGUF writer encodes; train.export_gguf is refused before training, naming that.
"""

from __future__ import annotations

from seqtune.config.schema import AttnImplementation
from seqtune.models.spec import ARCHITECTURES, Architecture

ARCHITECTURE = Architecture(
    name="gpt_oss",
    model_types=("gpt_oss",),
    gguf_refused="llama.cpp's gpt-oss needs the attention sinks, the experts' biases, the experts' interleaved "
    "gate/up split and YaRN rope scaling, which seqtune's GGUF writer does not encode (export the merged model, "
    "train.export_merged=true, and convert it with llama.cpp's convert_hf_to_gguf.py)",
    attention=(AttnImplementation.eager.value,),
    attention_needs="attention sinks (a learned logit per head in every softmax's denominator), which of seqtune's "
    "implementations only eager computes (transformers' gpt-oss has no sdpa path, its flash path takes the sinks "
    "only through hub kernels, and torch_varlen drops them)",
)

ARCHITECTURES.register(ARCHITECTURE)
