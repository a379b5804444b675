"""What every export of a run must say so it behaves like the run: the ids generation starts, stops and pads with,
the base the adapter goes on, and a model card that says what was trained on what.

Read once from the run directory (config.yaml, plan.json, preflight.json, metrics.jsonl, .hydra/overrides.yaml),
so export, best/ and `python -m seqtune.export RUN_DIR` write the same facts:
- `ShipFacts.stop`: bos, pad and every trained terminator (the tokenizer's eos first, then each end-of-turn token
  the train split's targets end on, as preflight counted them, and plan.tokens.turn_closer where message prompts
  generate assistant turns), written into config.json and generation_config.json;
- `base`: where the adapter's base is (model.path; for a tiny random model RUN_DIR/base/, the seeded base written
  there), named by adapter_config.json's base_model_name_or_path and the card's loading lines;
- `shipped_config(model)`: every saved config generates with a KV cache (use_cache true; training keeps false);
- `write_card(target, kind)`: README.md with the base, the data files and their sha256, steps, losses, the best of
  the eval metric the recipe's early stopping watches (RecipeSpec.early_stop_metric), the command.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from seqtune.config.plan import VisionFacts, load_plan
from seqtune.config.recipe_spec import Scored, recipe_spec
from seqtune.config.rundir import RUN_DIR_KEY
from seqtune.config.schema import SPLITS, RootConfig
from seqtune.data.formats import chat_template_reason
from seqtune.data.split import split_input
from seqtune.files import atomic_directory, sha256_file, write_atomic
from seqtune.hub import is_hub_id
from seqtune.models.quantized import held_quantized
from seqtune.models.vision import save_processor
from seqtune.preflight.config_rules import load_checked
from seqtune.preflight.result import load_result

BASE_DIR = "base"
CARD = "README.md"
OVERRIDES = Path(".hydra") / "overrides.yaml"


@dataclass(frozen=True, kw_only=True)
class StopIds:
    bos: int | None
    eos: tuple[int, ...]  # the tokenizer's eos first, then the other trained terminators
    pad: int | None
    names: dict[int, str]  # id -> token text, for the card and the proof's messages

    @property
    def eos_value(self) -> int | list[int]:
        """config.json / generation_config.json's eos_token_id: one id, or the list (as Llama 3.1 ships)."""
        return self.eos[0] if len(self.eos) == 1 else list(self.eos)


def stop_ids(tokenizer: Any, trained: Iterable[str], turn_closer: int | None) -> StopIds:
    """The tokenizer's bos/pad and its eos plus every terminator the train split's targets end on (`trained`:
    preflight.json's trained_terminators of data.train) and the chat template's turn closer where message prompts
    generate assistant turns (`turn_closer`: plan.tokens.turn_closer). A GRPO run's prompts train no terminator,
    its completions stop at the closer: the export stops where training's generation did."""
    eos = int(tokenizer.eos_token_id)
    names = {eos: tokenizer.eos_token}
    for text in trained:
        token_id = tokenizer.convert_tokens_to_ids(text)
        if token_id is not None and token_id != tokenizer.unk_token_id:
            names[int(token_id)] = text
    if turn_closer is not None:
        names.setdefault(int(turn_closer), tokenizer.convert_ids_to_tokens(int(turn_closer)))
    ordered = (eos, *sorted(set(names) - {eos}))
    return StopIds(bos=tokenizer.bos_token_id, eos=ordered, pad=tokenizer.pad_token_id, names=names)


def trained_terminators(run_dir: Path) -> dict[str, int]:
    """preflight.json's trained_terminators of data.train (token text -> count), empty without its content."""
    train = load_result(run_dir).splits.get("train")
    return train.content.trained_terminators if train is not None and train.content is not None else {}


def stamp_stop_ids(model: Any, stop: StopIds) -> None:
    """Set bos/eos/pad on the model's config and generation config (a PeftModel's are its base's), so every
    save_pretrained of it (model/, merged/, best/) writes the ids of the tokenizer trained with."""
    for config in _configs(model):
        config.bos_token_id = stop.bos
        config.eos_token_id = stop.eos_value
        config.pad_token_id = stop.pad


def _configs(model: Any) -> list[Any]:
    """config and generation config; a scalar-head model (ForSequenceClassification) generates nothing and has
    no generation config."""
    generation = getattr(model, "generation_config", None)
    return [model.config] if generation is None else [model.config, generation]


@contextmanager
def shipped_config(model: Any) -> Iterator[None]:
    """use_cache=True in the config.json and generation_config.json a save writes (generation wants its KV cache:
    without it every new token recomputes the whole sequence), and the training value (False: a cache would merge
    packed documents) back afterwards. A PeftModel's configs are its base's."""
    configs = _configs(model)
    before = [config.use_cache for config in configs]
    for config in configs:
        config.use_cache = True
    try:
        yield
    finally:
        for config, value in zip(configs, before, strict=True):
            config.use_cache = value


@dataclass(frozen=True, kw_only=True)
class ShipFacts:
    run_dir: Path
    cfg: RootConfig
    stop: StopIds
    resize_to: int | None
    validation: str | None  # plan.validation: which split validation is (data.val, data.val_fraction of train)
    # plan.scored: "scalar" ships the family's ForSequenceClassification (a reward model), anything else a causal LM.
    scored: str = "token"
    pad_id: int | None = None  # plan.tokens.pad_id: a scalar head's config.pad_token_id
    # The eval metric the recipe's early stopping watches (RecipeSpec.early_stop_metric: "loss", GRPO's "reward"):
    # the card shows its best (best_eval_<metric> in metrics.jsonl).
    watched: str = "loss"
    # plan.vision: an image-text model ships its processor and loads with AutoModelForImageTextToText.
    vision: VisionFacts | None = None
    # Which chat template the exports carry and why (seqtune.data.formats.chat_template_reason): printed, carded.
    template_note: str = ""
    # plan.checkpoint_load: how a pre-quantized model.path loaded ("stored": in its quantized Linears)
    checkpoint_load: str | None = None

    @property
    def quantized_base(self) -> bool:
        """The run trained over a base held quantized (QLoRA's NF4, or a checkpoint loaded as stored): peft's merge
        would quantize the merged weights again, so merged/ is built over the base loaded as float instead."""
        return held_quantized(load_in_4bit=self.cfg.model.load_in_4bit, load=self.checkpoint_load)

    @property
    def scalar(self) -> bool:
        return self.scored == Scored.scalar

    @property
    def base(self) -> str:
        """What adapter_config.json names as the base: model.path, else the seeded tiny base in RUN_DIR/base/."""
        if self.cfg.model.path:
            return str(Path(self.cfg.model.path).expanduser().resolve())
        return str((self.run_dir / BASE_DIR).resolve())


def ship_facts(tokenizer: Any, run_dir: Path) -> ShipFacts:
    run_dir = Path(run_dir)
    plan = load_plan(run_dir)
    stop = stop_ids(tokenizer, trained_terminators(run_dir), plan.tokens.turn_closer)
    if plan.scored == Scored.scalar:  # its pooling skips pad ids: one is always set, what training read around
        stop = replace(stop, pad=plan.tokens.pad_id)
    cfg = load_checked(run_dir / "config.yaml")
    return ShipFacts(
        run_dir=run_dir,
        cfg=cfg,
        stop=stop,
        resize_to=plan.vocab.resize_to,
        validation=plan.validation,
        scored=plan.scored,
        pad_id=plan.tokens.pad_id,
        watched=recipe_spec(plan.recipe).early_stop_metric,
        vision=plan.vision,
        template_note=chat_template_reason(cfg.data.format, tokenizer.chat_template),
        checkpoint_load=plan.checkpoint_load,
    )


def write_base(facts: ShipFacts, tokenizer: Any, *, device: Any) -> Path | None:
    """A tiny random model's base (the same seeded weights training started from, built on the training device,
    resized as trained) into RUN_DIR/base/, once; None for a model.path checkpoint (the base is that directory)."""
    from seqtune.models import build_model

    target = facts.run_dir / BASE_DIR
    if facts.cfg.model.path or (target / "config.json").is_file():
        return None
    base = build_model(facts.cfg.model, attn_implementation="sdpa", resize_to=facts.resize_to, device=device)
    stamp_stop_ids(base, facts.stop)
    with atomic_directory(target, key=RUN_DIR_KEY) as staging, shipped_config(base):
        base.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if facts.vision is not None:
            save_processor(staging, facts.vision, facts.cfg.model.path)
    return target


def _metrics(run_dir: Path) -> dict[str, Any]:
    """The last value of each metric in metrics.jsonl (train loss, eval, best eval, test)."""
    found: dict[str, Any] = {}
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                found.update(json.loads(line))
    return found


def command(run_dir: Path) -> str:
    """The command line that ran (Hydra's recorded overrides), `python -m seqtune` alone when none."""
    path = run_dir / OVERRIDES
    overrides = []
    if path.is_file():
        overrides = [line[2:].strip() for line in path.read_text().splitlines() if line.startswith("- ")]
    return " ".join(["python -m seqtune", *(shlex.quote(o) for o in overrides)])


def data_files(facts: ShipFacts, *, digests: bool = True) -> list[tuple[str, Path, str]]:
    """(split, file, sha256) of every data file the run read. Without `digests` (best/ during training: the other
    ranks wait at its barrier) the hash column says the final card has it."""
    rows = []
    for name in SPLITS:
        split = split_input(facts.cfg.data, name, facts.validation)
        for path in split.files if split is not None else []:
            digest = (
                sha256_file(path)
                if digests and path.is_file()
                else ("(a directory)" if path.is_dir() else "(in the card written at the end of the run)")
            )
            rows.append((name, path, digest))
    return rows


def _loss(value: Any) -> str:
    return "-" if value is None else f"{float(value):.4f}"


def hub_base(run_dir: Path) -> str | None:
    """model.path as the run named it (config.yaml keeps a hub id; the loaded config holds its local snapshot),
    when it is a hub id."""
    from omegaconf import OmegaConf

    path = OmegaConf.select(OmegaConf.load(run_dir / "config.yaml"), "model.path")
    return str(path) if is_hub_id(path) else None


def card_text(facts: ShipFacts, kind: str, *, files: list[tuple[str, Path, str]], repo_id: str | None = None) -> str:
    """README.md of an export: `kind` is adapter | model | merged | best. `repo_id`: the card of the Hub repository
    it is pushed to, which loads from there, and whose `base_model` is a Hub id or absent (the Hub refuses a local
    path there: its metadata check answers 400)."""
    cfg, run_dir, metrics = facts.cfg, facts.run_dir, _metrics(facts.run_dir)
    target = run_dir / kind
    where = repo_id or str(target.resolve())
    base_model = facts.base if repo_id is None else hub_base(run_dir)
    lora = kind in ("adapter", "best") and cfg.lora.enabled
    load = _load_lines(facts, where, lora=lora)
    base_note = (
        f"`{cfg.model.path}`"
        if cfg.model.path
        else f"a tiny random `{cfg.model.family}` model (model.seed={cfg.model.seed}), written to `{facts.base}`"
    )
    stops = ", ".join(f"`{facts.stop.names.get(i, i)}` ({i})" for i in facts.stop.eos)
    watched = facts.watched
    best = metrics.get(f"best_eval_{watched}")
    lines = [
        "---",
        *([f"base_model: {base_model}"] if base_model else []),
        *(["library_name: peft"] if lora else []),
        "tags:",
        "- seqtune",
        f"- {'lora' if cfg.lora.enabled else 'full-fine-tune'}",
        "---",
        "",
        f"# {run_dir.name}: {'LoRA adapter' if lora else 'model'} fine-tuned with seqtune ({kind}/)",
        "",
        f"Base: {base_note}. Data format: `{cfg.data.format}`. Generation stops at {stops}.",
        *(["", f"Chat template: {facts.template_note}."] if facts.template_note else []),
        "",
        "## Load",
        "",
        "```python",
        *load,
        "```",
        "",
        "## Data",
        "",
        "| split | file | sha256 |",
        "|---|---|---|",
        *[f"| {split} | `{path}` | `{digest}` |" for split, path, digest in files],
        "",
        "## Training",
        "",
        f"- steps: {metrics.get('step', '-')} (train.max_steps={cfg.train.max_steps})",
        f"- final train loss: {_loss(metrics.get('loss'))}",
        f"- final eval loss: {_loss(metrics.get('eval_loss'))}",
        *([f"- final eval {watched}: {_loss(metrics.get(f'eval_{watched}'))}"] if watched != "loss" else []),
        f"- best eval {watched}: {_loss(best)}" + (f" (step {metrics.get('best_step')})" if best is not None else ""),
        f"- test loss: {_loss(metrics.get('test_loss'))}",
        *(
            [f"- this directory holds the weights of the best eval (step {metrics.get('best_step')})"]
            if kind == "best"
            else []
        ),
        "",
        "## Command",
        "",
        "```bash",
        command(run_dir),
        "```",
        "",
    ]
    return "\n".join(lines)


def _load_lines(facts: ShipFacts, where: str, *, lora: bool) -> list[str]:
    """The card's Python that loads the export from `where`: the adapter on its base, or the model itself."""
    cfg = facts.cfg
    # A scalar head (a sequence classifier with one label) loads its causal base with the head the adapter holds.
    auto = "AutoModelForSequenceClassification" if facts.scalar else "AutoModelForCausalLM"
    head = f", num_labels=1, pad_token_id={facts.stop.pad}" if facts.scalar else ""
    if lora:
        load = [
            "from peft import PeftModel",
            f"from transformers import {auto}, AutoTokenizer",
            *(
                []
                if not facts.resize_to or not cfg.model.path
                else [f"# the base's embedding was resized to {facts.resize_to} rows for training"]
            ),
            f"base = {auto}.from_pretrained({facts.base!r}{head})",
            *([f"base.resize_token_embeddings({facts.resize_to})"] if facts.resize_to and cfg.model.path else []),
            f"model = PeftModel.from_pretrained(base, {where!r})",
            f"tokenizer = AutoTokenizer.from_pretrained({where!r})",
        ]
    else:
        load = [
            f"from transformers import {auto}, AutoTokenizer",
            f"model = {auto}.from_pretrained({where!r})",
            f"tokenizer = AutoTokenizer.from_pretrained({where!r})",
        ]
    return load


def write_card(facts: ShipFacts, target: Path, kind: str, *, files: list[tuple[str, Path, str]] | None = None) -> None:
    """`target`/README.md, the card of `kind` (target: RUN_DIR/kind, or the temporary directory that becomes it)."""
    text = card_text(facts, kind, files=data_files(facts) if files is None else files)
    write_atomic(target / CARD, text, key=RUN_DIR_KEY)
