"""A run's proven GGUF file, loaded in llama.cpp to generate: what `python -m seqtune.serve RUN_DIR --gguf FILE|TYPE`
and `python -m seqtune.chat RUN_DIR --gguf FILE|TYPE` answer with, through the same interface as
seqtune.export.engine.Engine. Served only once export.json says that file passed its proof (read back for the types
seqtune writes, run in llama.cpp for the k-quants). Prompts are rendered and ids decoded by the run's own
tokenizer (the proof showed llama.cpp reads rendered prompts to the same ids); generation ends at llama.cpp's
end-of-generation ids, as the proof's greedy tokens did, so greedy answers are the proof's tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from seqtune.config.errors import ConfigError
from seqtune.export.artifacts import GGUF_DIR, RUN_DIR_ARG
from seqtune.export.engine import RunTokenizer, Sampling, generation_defaults, pick
from seqtune.export.gguf import gguf_path
from seqtune.export.proof import EXPORT_JSON

GGUF_ARG = "--gguf"
# Tokens a served conversation holds (prompt and answer): llama.cpp allocates its KV cache for all of them up front.
CONTEXT = 4096


def gguf_file(run_dir: Path, requested: str) -> Path:
    """`--gguf`'s file: a path, or a type (q4_k_m, f16, ...) naming RUN_DIR/gguf/<run>-<type>.gguf; proven."""
    path = Path(requested) if requested.endswith(".gguf") else gguf_path(run_dir, requested)
    if not path.is_file():
        present = sorted(p.name for p in (run_dir / GGUF_DIR).glob("*.gguf"))
        raise ConfigError(
            f"{path} does not exist (RUN_DIR/{GGUF_DIR}/ holds {', '.join(present) or 'no GGUF file'}).",
            key=GGUF_ARG,
            fix=f"name one of those, or write it first: python -m seqtune.export {run_dir} --gguf TYPE",
        )
    proof = run_dir / EXPORT_JSON
    proven = json.loads(proof.read_text()).get("artifacts", []) if proof.is_file() else []
    if not any(p.get("artifact") == f"{GGUF_DIR}/{path.name}" and p.get("ok") for p in proven):
        raise ConfigError(
            f"{path} is not proven ({EXPORT_JSON} of {run_dir} has no passing proof of {GGUF_DIR}/{path.name}).",
            key=GGUF_ARG,
            fix=f"python -m seqtune.export {run_dir} --gguf TYPE (it writes and proves the file), then serve it.",
        )
    return path


def tokenizer_dir(run_dir: Path) -> Path:
    """Where the run's trained tokenizer and generation_config.json are: the export the GGUF file was written from."""
    found = next(
        (run_dir / n for n in ("merged", "model", "adapter") if (run_dir / n / "tokenizer_config.json").is_file()), None
    )
    if found is None:
        raise ConfigError(
            f"{run_dir} has no merged/, model/ or adapter/ with the run's tokenizer.",
            key=RUN_DIR_ARG,
            fix="name the run directory of a finished seqtune training run.",
        )
    return found


class GgufEngine(RunTokenizer):
    """The served GGUF file in llama.cpp, the run's tokenizer, stop ids and default sampling. Not thread-safe."""

    def __init__(self, run_dir: Path, requested: str) -> None:
        from transformers import AutoTokenizer, GenerationConfig

        from seqtune.llama_cpp import LlamaModel

        self.run_dir = Path(run_dir)
        path = gguf_file(self.run_dir, requested)
        self.artifact = f"{GGUF_DIR}/{path.name}"
        self.device = torch.device("cpu")
        source = tokenizer_dir(self.run_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(source)
        self.model = LlamaModel(path, n_ctx=CONTEXT)
        self.stop_ids = frozenset(self.model.end_ids())
        self.name = self.run_dir.name
        self.defaults = generation_defaults(GenerationConfig.from_pretrained(source))

    def stream(self, ids: list[int], sampling: Sampling) -> Iterator[int]:
        """New token ids, one at a time, ending with a stop id (included), after max_tokens, or when the context
        (CONTEXT tokens) is full."""
        generator = None
        if sampling.temperature > 0:
            generator = torch.Generator().manual_seed(sampling.seed if sampling.seed is not None else torch.seed())
        logits = self.model.next_logits(ids)
        for produced in range(1, sampling.max_tokens + 1):
            token = pick(torch.from_numpy(logits), sampling, generator)
            yield token
            if token in self.stop_ids or len(ids) + produced >= self.model.n_ctx:
                return
            logits = self.model.next_after(token)

    def text(self, tokens: list[int]) -> str:
        if tokens and tokens[-1] in self.stop_ids:
            tokens = tokens[:-1]
        return str(self.tokenizer.decode(tokens, skip_special_tokens=False))
