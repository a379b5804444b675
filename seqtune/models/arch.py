"""Arch: a causal LM's numbers and every tensor it declares, by name and shape, without building it.

What the memory estimate and the checkpoint check read. Two builders of one description:

- `layout_arch` writes the table down for the decoders whose module tree a family declares (its `Layout`, in
  seqtune/models/families/<family>.py: the Hugging Face Llama layout, with q/k norms, Gemma's four norms per layer, and which
  projections carry biases), from the config's numbers alone: no torch, no transformers. A tiny model's numbers come
  from its family's plain config kwargs (`tiny_arch`), so a dry run of a tiny model never imports either.
- `module_arch` walks a model built on the meta device (`meta_model`: any other architecture transformers ships,
  model=hf).

`config_arch` picks between them for a loaded Hugging Face config (the registry's `layout_for` its model_type).
model_configs.py resolves a run's Arch. tests/unit/models/test_arch.py proves the
written-down table equal to the meta model's for every named family, tiny and real-sized, with and without biases
and tied embeddings: a family whose layout changes in transformers fails there, not in a user's run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from seqtune.models.registry import layout_for
from seqtune.models.spec import ATTENTION_PROJECTIONS, MLP_PROJECTIONS, Layout

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

# Config attributes the numbers are read from, as transformers names them.
NUMBERS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
)


@dataclass(frozen=True, kw_only=True)
class Arch:
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    # The config's RoPE settings as transformers holds them (rope_facts reads them).
    rope_parameters: Mapping[str, Any] = field(default_factory=dict)
    # Every tensor the model loads (parameters and persistent buffers) by state_dict name: a tied head is listed
    # under both names, as state_dict lists it.
    tensors: dict[str, tuple[int, ...]]
    # Groups of names that are one tensor (a tied head and embedding).
    tied: list[set[str]]
    # The base model's attribute ("model"): checkpoints may store names without it.
    prefix: str
    # Every nn.Linear by module name: (in_features, out_features).
    linears: dict[str, tuple[int, int]]
    # The RMSNorm modules by name.
    norms: tuple[str, ...]
    # The decoder layers' module names, in order (model.layers.0, ...).
    layers: tuple[str, ...]
    head: str  # the output embedding's module name
    # The tensors as a checkpoint stores them when transformers converts them while loading (a mixture of experts:
    # each expert's gate/up/down matrices on file, one fused 3-D parameter per layer in the model); None when the
    # stored names and shapes are `tensors` themselves. From transformers' own conversion mapping, reverted as
    # save_pretrained reverts it (module_arch), so the checkpoint proof checks what the loader will convert.
    stored: dict[str, tuple[int, ...]] | None = None

    def parameters(self) -> dict[str, int]:
        """Distinct parameters (a tied weight once, under its first name) -> element count."""
        alias = {name: min(group) for group in self.tied for name in group}
        counts: dict[str, int] = {}
        for name, shape in self.tensors.items():
            counts.setdefault(alias.get(name, name), _numel(shape))
        return counts

    def total(self) -> int:
        return sum(self.parameters().values())

    def under(self, names: set[str] | frozenset[str] | tuple[str, ...]) -> int:
        """Elements of the distinct parameters inside any module whose own name (last component) is in `names`,
        at any depth (what `module.parameters()` of each such module counts, a shared tensor once)."""
        return sum(self.tensors_under(names).values())

    def tensors_under(self, names: set[str] | frozenset[str] | tuple[str, ...]) -> dict[str, int]:
        """`under`, tensor by tensor: distinct parameter name -> elements."""
        alias = {name: min(group) for group in self.tied for name in group}
        found: dict[str, int] = {}
        for name, shape in self.tensors.items():
            if any(part in names for part in name.split(".")[:-1]):
                found.setdefault(alias.get(name, name), _numel(shape))
        return found

    def layer_params(self, layer: str) -> int:
        prefix = layer + "."
        return sum(count for name, count in self.parameters().items() if name.startswith(prefix))

    def layer_linears(self, layer: str) -> dict[str, tuple[int, int]]:
        """The Linears of one decoder layer, by their name inside it (self_attn.q_proj, ...)."""
        prefix = layer + "."
        return {name[len(prefix) :]: shape for name, shape in self.linears.items() if name.startswith(prefix)}

    def layer_norms(self, layer: str) -> list[str]:
        prefix = layer + "."
        return [name[len(prefix) :] for name in self.norms if name.startswith(prefix)]

    def head_numel(self) -> int:
        return _numel(self.tensors[f"{self.head}.weight"])

    def with_vocab(self, rows: int) -> Arch:
        """The same model with its embedding and head resized to `rows` (model.resize_embeddings)."""
        tensors = dict(self.tensors)
        for name in (f"{self.prefix}.embed_tokens.weight", f"{self.head}.weight"):
            if name in tensors:
                tensors[name] = (rows, *tensors[name][1:])
        return replace(self, vocab_size=rows, tensors=tensors)

    def with_scalar_head(self) -> Arch:
        """The family's ForSequenceClassification with one label: the LM head replaced by `score` (hidden -> 1, no
        bias), a tied head's tensor remaining the embedding alone."""
        head = f"{self.head}.weight"
        tensors = {name: shape for name, shape in self.tensors.items() if name != head}
        tensors["score.weight"] = (1, self.hidden_size)
        linears = {name: shape for name, shape in self.linears.items() if name != self.head}
        linears["score"] = (self.hidden_size, 1)
        tied = [group - {head} for group in self.tied if len(group - {head}) > 1]
        return replace(self, tensors=tensors, linears=linears, tied=tied, head="score", tie_word_embeddings=False)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def numbers_of(config: Any) -> dict[str, Any]:
    """The numbers of a config (a transformers config, or a plain namespace of its kwargs), with the rules the
    layout families' config classes apply to missing ones: key-value heads = query heads, head_dim =
    hidden / heads."""
    # An image-text config holds its language model's numbers under text_config (get_text_config); whether the
    # head is tied is the whole model's.
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    values: dict[str, Any] = {name: getattr(text, name, None) for name in NUMBERS}
    if text is not config:
        values["tie_word_embeddings"] = getattr(config, "tie_word_embeddings", values["tie_word_embeddings"])
    if values["num_key_value_heads"] is None:
        values["num_key_value_heads"] = values["num_attention_heads"]
    if values["head_dim"] is None:
        values["head_dim"] = values["hidden_size"] // values["num_attention_heads"]
    values["tie_word_embeddings"] = bool(values["tie_word_embeddings"])
    return values


def layout_arch(
    model_type: str,
    layout: Layout,
    numbers: Mapping[str, Any],
    *,
    biased: frozenset[str] = frozenset(),
    rope_parameters: Mapping[str, Any] | None = None,
) -> Arch:
    """The tensor table of a Llama-layout decoder (a family's `Layout`) from its numbers; `biased`: the
    projections that carry a bias (`Layout.biased` of the config)."""
    assert biased <= {*ATTENTION_PROJECTIONS, *MLP_PROJECTIONS}, biased
    hidden, ffn, heads, kv, head_dim, vocab = (
        int(numbers[k])
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
        )
    )
    layer_count = int(numbers["num_hidden_layers"])
    tied = bool(numbers["tie_word_embeddings"])
    tensors: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    linears: dict[str, tuple[int, int]] = {}
    norms: list[str] = []

    def linear(name: str, fan_in: int, fan_out: int) -> None:
        linears[name] = (fan_in, fan_out)
        tensors[f"{name}.weight"] = (fan_out, fan_in)
        if name.rsplit(".", 1)[-1] in biased and name != "lm_head":
            tensors[f"{name}.bias"] = (fan_out,)

    def norm(name: str, size: int) -> None:
        norms.append(name)
        tensors[f"{name}.weight"] = (size,)

    layers = tuple(f"model.layers.{i}" for i in range(layer_count))
    for layer in layers:
        attn = f"{layer}.self_attn"
        linear(f"{attn}.q_proj", hidden, heads * head_dim)
        linear(f"{attn}.k_proj", hidden, kv * head_dim)
        linear(f"{attn}.v_proj", hidden, kv * head_dim)
        linear(f"{attn}.o_proj", heads * head_dim, hidden)
        if layout.qk_norm:
            norm(f"{attn}.q_norm", head_dim)
            norm(f"{attn}.k_norm", head_dim)
        linear(f"{layer}.mlp.gate_proj", hidden, ffn)
        linear(f"{layer}.mlp.up_proj", hidden, ffn)
        linear(f"{layer}.mlp.down_proj", ffn, hidden)
        norm(f"{layer}.input_layernorm", hidden)
        norm(f"{layer}.post_attention_layernorm", hidden)
        if layout.sandwich_norms:
            norm(f"{layer}.pre_feedforward_layernorm", hidden)
            norm(f"{layer}.post_feedforward_layernorm", hidden)
    norm("model.norm", hidden)
    linear("lm_head", hidden, vocab)
    return Arch(
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layer_count,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        rope_parameters=dict(rope_parameters or {}),
        tensors=tensors,
        tied=[{"model.embed_tokens.weight", "lm_head.weight"}] if tied else [],
        prefix="model",
        linears=linears,
        norms=tuple(norms),
        layers=layers,
        head="lm_head",
    )


def config_arch(hf_config: Any) -> Arch:
    """The Arch of a loaded transformers config: written down when a family declares the Layout of its model_type,
    else walked on a meta model (imports transformers' modeling code)."""
    model_type = str(getattr(hf_config, "model_type", ""))
    layout = layout_for(model_type)
    if layout is not None:
        return layout_arch(
            model_type,
            layout,
            numbers_of(hf_config),
            biased=layout.biased(hf_config),
            rope_parameters=getattr(hf_config, "rope_parameters", None) or {},
        )
    return module_arch(meta_model(hf_config), hf_config)


def meta_model(hf_config: PretrainedConfig) -> PreTrainedModel:
    """The model's module tree on the meta device: shapes and names, no memory, no init. For the architectures
    no family writes down."""
    import torch
    import transformers

    # An image-text config (a vision tower around a text model) builds the class AutoModelForImageTextToText maps.
    auto = (
        transformers.AutoModelForImageTextToText
        if getattr(hf_config, "vision_config", None) is not None
        else transformers.AutoModelForCausalLM
    )
    with torch.device("meta"):
        return auto.from_config(hf_config)


def module_arch(model: Any, hf_config: Any) -> Arch:
    """The Arch of a built model (the meta device is enough: shapes and names only)."""

    from seqtune.models.layers import decoder_layers

    tensors = {name: tuple(t.shape) for name, t in model.state_dict(keep_vars=True).items()}
    groups: dict[int, set[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), set()).add(name)
    tied = [g for g in groups.values() if len(g) > 1]
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    # transformers ties at load, so a tied head may also be a separate module until then.
    if getattr(hf_config, "tie_word_embeddings", False) and head is not None and head.weight is not embed.weight:
        tied.append(
            {n for n, p in model.named_parameters(remove_duplicate=False) if p is head.weight or p is embed.weight}
        )
    modules = dict(model.named_modules())
    by_module = {id(m): name for name, m in modules.items()}
    numbers = numbers_of(hf_config)
    layers = tuple(by_module[id(layer)] for layer in decoder_layers(model))
    linears = _linears(modules)
    if numbers["intermediate_size"] is None:  # GPT-2 names it n_inner (null = 4 x hidden): the MLP's widest Linear
        numbers["intermediate_size"] = max(
            out for name, (_, out) in linears.items() if name.startswith(layers[0] + ".")
        )
    stored = _stored_tensors(model)
    if stored != tensors:  # a tied tensor is one tensor under its saved names too (Gemma 3's multimodal head)
        tied = [group | _stored_names(model, group) for group in tied]
    return Arch(
        model_type=str(getattr(hf_config, "model_type", "")),
        **numbers,
        rope_parameters=getattr(hf_config, "rope_parameters", None) or {},
        tensors=tensors,
        tied=tied,
        prefix=model.base_model_prefix,
        linears=linears,
        norms=tuple(name for name, m in modules.items() if type(m).__name__.endswith("RMSNorm")),
        layers=layers,
        head=by_module[id(head)],
        stored=None if stored == tensors else stored,
    )


def _linears(modules: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Every matrix-multiplying module by name: (in, out). nn.Linear, and transformers' Conv1D (GPT-2's
    projections: a Linear with its weight stored transposed, which peft adapts too)."""
    from torch import nn

    found: dict[str, tuple[int, int]] = {}
    for name, m in modules.items():
        if isinstance(m, nn.Linear):
            found[name] = (m.in_features, m.out_features)
        elif type(m).__name__ == "Conv1D":
            found[name] = (m.nx, m.nf)
    return found


def _stored_tensors(model: Any) -> dict[str, tuple[int, ...]]:
    """The model's tensors named and shaped as save_pretrained writes them: transformers' conversion mapping for
    the architecture, reverted (on the meta device: shapes only)."""
    from transformers.core_model_loading import revert_weight_conversion

    state = dict(model.state_dict(keep_vars=True))
    return {name: tuple(t.shape) for name, t in revert_weight_conversion(model, state).items()}


def _stored_names(model: Any, names: set[str]) -> set[str]:
    """`names` as save_pretrained writes them (transformers' conversion mapping reverted, one by one)."""
    from transformers.core_model_loading import revert_weight_conversion

    state = dict(model.state_dict(keep_vars=True))
    return {new for name in names if name in state for new in revert_weight_conversion(model, {name: state[name]})}


def tiny_arch(model_type: str, layout: Layout, kwargs: Mapping[str, Any]) -> Arch:
    """The Arch of a tiny model from its family's plain config kwargs (spec.tiny_config_kwargs): no transformers."""
    config = SimpleNamespace(**kwargs)
    return layout_arch(
        model_type,
        layout,
        numbers_of(config),
        biased=layout.biased(config),
        rope_parameters=kwargs.get("rope_parameters") or {},
    )
