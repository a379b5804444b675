"""Reward models as rewards: an entry of the reward list naming a directory, or `hf:org/name[@revision]`, is a
sequence classifier with one label that scores each completion (torch-free until one is loaded).

What loads: any directory AutoModelForSequenceClassification loads with num_labels=1 (a reward recipe's merged/
export, a Hub reward model), or a peft adapter directory of task SEQ_CLS (a reward recipe's adapter/ export: its
base loaded with one label, the adapter merged in). `hf:` ids resolve through the hub cache (seqtune.hub), offline
first. Anything else is refused naming the entry's key and the fix, before any generation.

How a completion is scored: rendered with the reward model's OWN tokenizer, as reward models are trained (TRL's
RewardTrainer, seqtune's preference kind): a message-list prompt with the completion as an assistant turn through
its chat template; a string prompt joined to the completion with the tokenizer's special tokens and eos at the end
(the terminator whose hidden state the head reads). Batches are right-padded, scored without autograd, and each
completion's reward is the single logit.

Preflight (reward_model_problems): the tokenizer reads every token the policy can write (no unknown token, no id
past the model's embedding rows); message prompts need its chat template; two real prompts with dummy completions
score finite. Its weights are counted by the memory estimate (parameter_count, from the safetensors headers).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.errors import ModelLoadError

HF_PREFIX = "hf:"
# Completions scored per forward: a bound on the reward model's activations, not a tuning knob.
SCORE_BATCH = 16
# Policy tokens a refusal quotes (of those the reward model's tokenizer cannot read).
QUOTED = 5
_FIX = (
    "name a reward model: a directory AutoModelForSequenceClassification loads with one label (a reward run's "
    "merged/ or adapter/ export), hf:org/name of one in the hub cache, or a reward function FILE.py:FUNCTION"
)


def is_reward_model_ref(ref: str) -> bool:
    """A reward-list entry that names a model: hf:..., an existing directory, or a path (a "/" in an entry that is
    not MODULE:FUNCTION; loading refuses it when it is no directory)."""
    if ref.startswith(HF_PREFIX) or Path(ref).expanduser().is_dir():
        return True
    module, _, name = ref.rpartition(":")
    return "/" in ref and not (module and name.isidentifier())


def resolve_directory(key: str, ref: str) -> Path:
    """The local directory an entry names: hf:org/name[@revision] through the hub cache, else the path itself."""
    from seqtune.hub import HUB_ID, resolve_snapshot

    if ref.startswith(HF_PREFIX):
        repo_id, _, revision = ref[len(HF_PREFIX) :].partition("@")
        if not HUB_ID.match(repo_id):
            raise ModelLoadError(f"{key}={ref}: {repo_id!r} is not a hub id (org/name).", key=key, fix=_FIX)
        return resolve_snapshot(repo_id, revision=revision or None, key=key)
    directory = Path(ref).expanduser()
    if not directory.is_dir():
        raise ModelLoadError(
            f"{key}={ref}: not a directory (paths are relative to {Path.cwd()}), and not MODULE:FUNCTION.",
            key=key,
            fix=_FIX,
        )
    return directory


def _config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _adapter_base(key: str, ref: str, directory: Path) -> Path | None:
    """The base checkpoint of a SEQ_CLS adapter directory; None when `directory` holds a whole model."""
    path = directory / "adapter_config.json"
    if not path.is_file():
        return None
    adapter = json.loads(path.read_text())
    if adapter.get("task_type") != "SEQ_CLS":
        raise ModelLoadError(
            f"{key}={ref}: a peft adapter of task {adapter.get('task_type')}, not a sequence classifier (SEQ_CLS): "
            "it scores nothing.",
            key=key,
            fix=_FIX,
        )
    from seqtune.hub import is_hub_id

    base = str(adapter["base_model_name_or_path"])  # a local checkpoint (seqtune's RUN/base), or a Hub id
    return resolve_directory(key, HF_PREFIX + base if is_hub_id(base) else base)


def check_classifier(key: str, ref: str, directory: Path) -> None:
    """Refuse, from config.json alone, what is no sequence classifier with one label."""
    if _adapter_base(key, ref, directory) is not None:
        return  # the adapter's base is a causal checkpoint: its head (one label) is the adapter's
    config = _config(directory)
    if not config:
        raise ModelLoadError(f"{key}={ref}: {directory} holds no config.json: no model.", key=key, fix=_FIX)
    architectures = list(config.get("architectures") or [])
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        raise ModelLoadError(
            f"{key}={ref}: config.json names {', '.join(architectures) or 'no architecture'}, not a sequence "
            "classifier (a reward model is a *ForSequenceClassification with one label).",
            key=key,
            fix=_FIX,
        )
    labels = len(config["id2label"]) if "id2label" in config else config.get("num_labels", 2)
    if labels != 1:
        raise ModelLoadError(
            f"{key}={ref}: a sequence classifier with {labels} labels, not one (a reward model's single logit).",
            key=key,
            fix=_FIX,
        )


def parameter_count(ref: str) -> int:
    """The parameters the loaded reward model holds (the memory estimate's term), from the safetensors headers, no
    tensor read: a whole model's tensors; an adapter's base without its causal head (`lm_head`, which the classifier
    does not load) plus the adapter's own tensors other than LoRA's (merged away). 0 when `ref` names no readable
    checkpoint: loading it is refused by name (reward_model_problems' caller), not here."""
    from seqtune.config.errors import SeqtuneError

    try:
        directory = resolve_directory("", ref)
        base = _adapter_base("", ref, directory)
        if base is None:
            return sum(_shapes(directory).values())
        own = {name: n for name, n in _shapes(directory).items() if ".lora_" not in name}
        causal = {name: n for name, n in _shapes(base).items() if not name.startswith("lm_head.")}
    except (SeqtuneError, OSError, ValueError, struct.error):  # a damaged header: loading refuses it by name
        return 0
    return sum(own.values()) + sum(causal.values())


def scorer_params(cfg: Any) -> int:
    """The parameters of the reward models among cfg.rollout.rewards (an online recipe's RecipeSpec.scorer_params:
    plan.scorer_params, the memory estimate's frozen scorer weights)."""
    return sum(parameter_count(str(ref)) for ref in cfg.rollout.rewards if is_reward_model_ref(str(ref)))


def _shapes(directory: Path) -> dict[str, int]:
    """name -> elements of every tensor in the directory's safetensors files."""
    elements: dict[str, int] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with file.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        elements.update({k: math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__"})
    return elements


@dataclass
class RewardModel:
    """A loaded reward model, called as a reward function is: fn(prompts=, completions=, completion_ids=,
    **columns) -> one float per completion (the columns and completion_ids are not read)."""

    key: str  # the reward list's entry (rollout.rewards[i])
    ref: str
    name: str  # its metric is rewards/<name>
    model: Any  # a transformers ForSequenceClassification, eval mode, frozen
    tokenizer: Any  # its own
    device: Any  # torch.device

    def __call__(
        self, prompts: list[Any], completions: list[Any], completion_ids: list[list[int]] | None = None, **columns: Any
    ) -> list[float | None]:  # a reward function's type (None: abstains); a reward model scores every completion
        import torch

        rows = [self.render(p, c) for p, c in zip(prompts, completions, strict=True)]
        pad = self.model.config.pad_token_id
        scores: list[float | None] = []
        with torch.no_grad():
            for start in range(0, len(rows), SCORE_BATCH):
                batch = rows[start : start + SCORE_BATCH]
                width = max(map(len, batch))
                ids = torch.full((len(batch), width), pad, dtype=torch.long)
                mask = torch.zeros_like(ids)
                for r, row in enumerate(batch):  # right padding: transformers pools at the last non-pad token
                    ids[r, : len(row)], mask[r, : len(row)] = torch.tensor(row), 1
                out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
                scores += out.logits[:, 0].float().cpu().tolist()
        return scores

    def render(self, prompt: Any, completion: Any) -> list[int]:
        """The token ids the reward model reads for one (prompt, completion), as reward models are trained."""
        tokenizer = self.tokenizer
        if isinstance(prompt, list):
            turn = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
            text = tokenizer.apply_chat_template([*prompt, *turn], tokenize=False)
            return list(tokenizer(text, add_special_tokens=False)["input_ids"])
        text = str(prompt) + (str(completion[-1]["content"]) if isinstance(completion, list) else str(completion))
        ids = list(tokenizer(text)["input_ids"])
        eos = tokenizer.eos_token_id
        return ids + [eos] if eos is not None and (not ids or ids[-1] != eos) else ids

    @property
    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def load_reward_model(key: str, ref: str, *, device: Any, dtype: Any) -> RewardModel:
    """Load the reward model `ref` names onto `device` in `dtype` (a torch dtype or its name), frozen, in eval mode;
    ModelLoadError (exit 2) naming `key` for what is no directory, no sequence classifier with one label, or fails
    to load."""
    directory = resolve_directory(key, ref)
    check_classifier(key, ref, directory)
    try:
        model, tokenizer = _load(key, ref, directory, dtype)
    except ModelLoadError:
        raise
    except Exception as exc:  # a broken checkpoint raises anything: the refusal names it
        raise ModelLoadError(
            f"{key}={ref}: loading {directory} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            key=key,
            fix=_FIX,
        ) from exc
    model.requires_grad_(False)
    name = ref[len(HF_PREFIX) :].partition("@")[0] if ref.startswith(HF_PREFIX) else str(ref)
    return RewardModel(
        key=key,
        ref=ref,
        name=name.rstrip("/").rsplit("/", 1)[-1],
        model=model.to(device).eval(),
        tokenizer=tokenizer,
        device=device,
    )


def _load(key: str, ref: str, directory: Path, dtype: Any) -> tuple[Any, Any]:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    base = _adapter_base(key, ref, directory)
    if base is None:
        model = AutoModelForSequenceClassification.from_pretrained(directory, dtype=dtype)
    else:
        from peft import PeftModel

        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        causal = AutoModelForSequenceClassification.from_pretrained(base, dtype=dtype, num_labels=1, pad_token_id=pad)
        model = PeftModel.from_pretrained(causal, directory).merge_and_unload()
    if model.config.pad_token_id is None:  # as TRL does: a tokenizer without a pad token pads with eos
        model.config.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
    if model.config.pad_token_id is None:
        raise ModelLoadError(
            f"{key}={ref}: neither its config nor its tokenizer names a pad or eos token, so a batch of "
            "completions cannot be padded for it.",
            key=key,
            fix="set pad_token_id in its config.json",
        )
    return model, tokenizer


def reward_model_problems(
    reward_model: RewardModel, prompts: list[Any], policy_tokenizer: Any
) -> list[tuple[str, str]]:
    """What makes `reward_model` unable to score the policy's completions, as (key, message with the fix): message
    `prompts` and no chat template; a tokenizer that cannot read every token the policy can write; scoring the
    (two, real) `prompts` with dummy completions raising or giving a non-finite score."""
    key, ref = reward_model.key, reward_model.ref
    if any(isinstance(p, list) for p in prompts) and not getattr(reward_model.tokenizer, "chat_template", None):
        return [
            (
                key,
                f"{key}={ref}: the prompts are message lists, and its tokenizer has no chat template to render "
                "them with a completion as the assistant turn. Fix: put the chat template it was trained with into "
                "the directory (chat_template.jinja), or string prompts",
            )
        ]
    why = _unreadable(reward_model, policy_tokenizer) or _dry_score(reward_model, prompts)
    return [(key, f"{key}={ref}: {why}")] if why else []


def _dry_score(reward_model: RewardModel, prompts: list[Any]) -> str:
    """Why scoring `prompts` with dummy completions fails, or ""."""
    if not prompts:
        return ""
    dummy = [[{"role": "assistant", "content": "a"}] if isinstance(p, list) else "a" for p in prompts]
    try:
        scores = reward_model(prompts=prompts, completions=dummy)
    except Exception as exc:  # noqa: BLE001  # a model or template raises anything: the refusal names it
        return (
            f"scoring {len(prompts)} real prompts with dummy completions failed: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}. Fix: {_FIX}"
        )
    if not all(s is not None and math.isfinite(s) for s in scores):
        return f"scoring {len(prompts)} real prompts with dummy completions gave {scores}. Fix: {_FIX}"
    return ""


def _unreadable(reward_model: RewardModel, policy_tokenizer: Any) -> str:
    """Why its tokenizer cannot read the policy's completions (every non-special token the policy can write, as
    the completion's decoded text), or ""."""
    tokenizer = reward_model.tokenizer
    rows = reward_model.model.get_input_embeddings().weight.shape[0]
    unk = tokenizer.unk_token_id
    if unk is None and len(tokenizer) <= rows:  # byte-level: it reads any text, and every id it gives has a row
        return ""
    if len(tokenizer) <= rows and tokenizer.get_vocab() == policy_tokenizer.get_vocab():  # the policy's own
        return ""
    special = set(policy_tokenizer.all_special_ids)
    ids = [i for i in range(len(policy_tokenizer)) if i not in special]
    # A byte-fallback token alone decodes to U+FFFD (half a character): completions hold whole characters.
    pieces = [p for p in policy_tokenizer.batch_decode([[i] for i in ids]) if p.strip() and "\ufffd" not in p]
    encoded = tokenizer(pieces, add_special_tokens=False)["input_ids"]
    unknown = [p for p, row in zip(pieces, encoded, strict=True) if unk is not None and unk in row]
    beyond = sorted({i for row in encoded for i in row if i >= rows})
    if unknown:
        quoted = ", ".join(repr(p) for p in unknown[:QUOTED])
        return (
            f"its tokenizer reads {len(unknown)} of the {len(pieces)} tokens the policy can write as its unknown "
            f"token {tokenizer.unk_token!r} (e.g. {quoted}), so it would score text it cannot see. Fix: a reward "
            "model whose tokenizer covers the policy's vocabulary (the policy's own family)"
        )
    if beyond:
        return (
            f"its tokenizer gives ids up to {beyond[-1]} for the policy's tokens, past its embedding's {rows} rows. "
            "Fix: a reward model whose tokenizer matches its own weights"
        )
    return ""
