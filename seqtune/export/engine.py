"""A finished run's proven export, loaded to generate: what `python -m seqtune.serve` and `python -m seqtune.chat`
answer with. merged/ (or model/ for a full fine-tune, or adapter/ on its base when neither exists), loaded exactly
as the export proof loaded it (proof.load_artifact), and only once export.json says that artifact passed. Prompts
are rendered with the run's chat template; generation ends at the trained terminators (the artifact's
generation_config.json eos ids) and follows its settings unless a request states its own. Greedy decoding here is
the export proof's greedy decoding: the same model, the same ids, a KV cache (which the proof showed gives the
tokens recomputing gives).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from seqtune.config.errors import ConfigError
from seqtune.export.artifacts import RUN_DIR_ARG
from seqtune.export.proof import EXPORT_JSON

if TYPE_CHECKING:
    from transformers import GenerationConfig

SERVED = ("merged", "model", "adapter")


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """How the next token is picked: greedy when temperature is 0 (or do_sample is off)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


def generation_defaults(config: GenerationConfig) -> Sampling:
    """The sampling a run's generation_config.json asks for: greedy unless it samples, 256 new tokens when it names
    no max_new_tokens (both engines' defaults, whatever model serves)."""
    return Sampling(
        max_tokens=config.max_new_tokens or 256,
        temperature=float(config.temperature or 1.0) if config.do_sample else 0.0,
        top_p=float(config.top_p or 1.0) if config.do_sample else 1.0,
    )


class RunTokenizer:
    """A conversation or a rendered text as token ids through the served run's tokenizer (`self.tokenizer`)."""

    tokenizer: Any

    def chat_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The conversation rendered with the run's chat template and its generation prompt, as token ids."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.text_ids(str(text))

    def text_ids(self, text: str) -> list[int]:
        """A rendered text's ids: its special tokens are the template's, none added again."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def served_artifact(run_dir: Path) -> str:
    """The export a run is served from: the first of merged/, model/, adapter/ it has, proven by export.json."""
    name = next((n for n in SERVED if (run_dir / n).is_dir()), None)
    proof = run_dir / EXPORT_JSON
    if name is None:
        raise ConfigError(
            f"{run_dir} has no merged/, model/ or adapter/ to serve.",
            key=RUN_DIR_ARG,
            fix="name the run directory of a finished seqtune training run.",
        )
    proven = json.loads(proof.read_text()).get("artifacts", []) if proof.is_file() else []
    if not any(p.get("artifact") == name and p.get("ok") for p in proven):
        raise ConfigError(
            f"{run_dir}/{name} is not proven ({EXPORT_JSON} has no passing proof of it).",
            key=RUN_DIR_ARG,
            fix=f"python -m seqtune.export {run_dir} (it proves every export), then serve it again.",
        )
    return name


class Engine(RunTokenizer):
    """The served model, its tokenizer, stop ids and default sampling. Not thread-safe: callers hold one lock."""

    def __init__(self, run_dir: Path, *, device: str | None = None) -> None:
        from transformers import AutoTokenizer, GenerationConfig

        from seqtune.export.artifacts import load_artifact
        from seqtune.export.facts import ship_facts

        self.run_dir = Path(run_dir)
        self.artifact = served_artifact(self.run_dir)
        directory = self.run_dir / self.artifact
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        facts = ship_facts(self.tokenizer, self.run_dir)
        self.model = load_artifact(facts, self.artifact, device=self.device)
        config = GenerationConfig.from_pretrained(directory)
        listed = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
        self.stop_ids = frozenset(int(t) for t in listed if t is not None)
        self.name = self.run_dir.name
        self.defaults = generation_defaults(config)

    @torch.no_grad()
    def stream(self, ids: list[int], sampling: Sampling) -> Iterator[int]:
        """New token ids, one at a time, ending with a stop id (included) or after max_tokens."""
        generator = None
        if sampling.temperature > 0:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())
        inputs, past = torch.tensor([ids], device=self.device), None
        for _ in range(sampling.max_tokens):
            out: Any = self.model(input_ids=inputs, past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = pick(out.logits[0, -1].float(), sampling, generator)
            yield token
            if token in self.stop_ids:
                return
            inputs = torch.tensor([[token]], device=self.device)

    def text(self, tokens: list[int]) -> str:
        """The answer's text: its tokens without the terminator that ended it."""
        if tokens and tokens[-1] in self.stop_ids:
            tokens = tokens[:-1]
        return str(self.tokenizer.decode(tokens, skip_special_tokens=False))


def pick(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    if sampling.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < sampling.top_p  # the smallest set reaching top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


def text_deltas(engine: Engine, tokens: Iterator[int], produced: list[int]) -> Iterator[str]:
    """The new text as tokens arrive (each appended to `produced`): the text is decoded whole each time and only its
    new end sent; an incomplete UTF-8 character (a byte-level token's half, decoded as U+FFFD) is held until it
    completes."""
    sent = ""
    for token in tokens:
        produced.append(token)
        text = engine.text(produced)
        if text.endswith("\ufffd") and token not in engine.stop_ids:
            continue
        yield text[len(sent) :]
        sent = text
