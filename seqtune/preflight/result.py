"""What preflight found: typed result dataclasses and their preflight.json round trip.

The parent writes preflight.json once; every rank reads it back with `load_result` (max_seq_len in force, token
cache directories, the plan), so ranks never re-scan the data.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from seqtune.config.rundir import RUN_DIR_KEY
from seqtune.files import write_atomic
from seqtune.preflight.checks import Problem

RESULT_FILE = "preflight.json"
REJECTS_FILE = "rejects.jsonl"


@dataclass(kw_only=True)
class ContentStats:
    """What one split's labels and text hold (seqtune.preflight.content): the second wave of checks' results."""

    # Maximal runs of targets (assistant turns, completions) and how they end: "last token -> next token".
    target_spans: int
    span_ends: dict[str, int]
    # Terminators (eos, the family's end-of-turn, the template's turn closer) trained, by text: target count.
    trained_terminators: dict[str, int]
    masked_terminators: int
    unterminated_spans: int | None  # None: a kind whose targets do not train (prompts end no reply)
    # Control tokens the samples use, by text: {"inputs": n, "targets": n}.
    special_tokens: dict[str, dict[str, int]]
    literal_special_lines: int
    double_bos: int
    # Over-length samples whose final eos / end-of-turn the over-length policy cuts.
    terminator_cut: int
    # Exact copies of another sample of the split; for val/test, of a train sample (None for train).
    duplicates: int
    duplicates_of_train: int | None = None
    # Samples compared with their rendered text (seqtune.preflight.tokens_text), and those whose tokens differ.
    text_checked: int = 0
    text_mismatched: int = 0


@dataclass(kw_only=True)
class SourceStats:
    """One source of a split (an item of data.<split>): what the scan read and what an epoch uses."""

    key: str  # data.train, data.train[1]
    format: str
    files: int
    records: int
    rejected: int
    # Samples it gave (records - rejected) and those left after data.overlength (drop, or truncate leaving none).
    samples: int
    kept: int
    weight: float = 1.0
    # Samples an epoch draws from it: round(weight x kept) for train (seqtune.data.mix), kept for val/test;
    # data.mode=stream: the records a pass deals from it, round(weight x records) over the whole source.
    used_per_epoch: int = 0


@dataclass(kw_only=True)
class SplitStats:
    records: int
    rejected: int
    # min / median / p99 / max token lengths of the accepted samples' sequences (a pair's chosen and rejected).
    lengths: dict[str, int]
    # Samples (pairs: either sequence) longer than max_seq_len; over_limit, truncated and dropped count samples.
    over_limit: int
    # None for a kind whose targets do not train (prompts: their one target is an anchor; nothing of them trains).
    trainable_fraction: float | None = 0.0
    zero_target: int | None = 0
    reject_reasons: dict[str, int] = field(default_factory=dict)
    # Samples changed by data.overlength=truncate|drop (reported because it is an explicit policy).
    truncated: int = 0
    dropped: int = 0
    # Pre-tokenized rows that arrived already padded (the padding was stripped).
    prepadded: int = 0
    content: ContentStats | None = None
    sources: list[SourceStats] = field(default_factory=list)


@dataclass(kw_only=True)
class VocabStats:
    tokenizer_size: int
    embedding_rows: int
    output_rows: int | None = None
    max_token_id: int = -1
    max_token_location: str | None = None
    # The embedding size in force with model.resize_embeddings=true (multiple of 64), else null.
    resized_to: int | None = None


@dataclass(kw_only=True)
class PaddingStats:
    strategy: str
    side: str | None = None
    # Real tokens / padded tokens over the train split's planned batches (1.0 = no padding at all).
    efficiency: float | None = None


@dataclass(kw_only=True)
class SplitPlan:
    # Samples one epoch uses (weighted train sources: the mix's draw, repeats included; data.mode=stream: the
    # records a pass deals).
    samples: int
    # Per rank (index = rank): real samples and tokens one epoch gives it. Micro-batches are equal by construction.
    samples_per_rank: list[int]
    tokens_per_rank: list[int]
    micro_batches_per_rank: int
    dropped_samples: int = 0
    filler_samples: int = 0
    # None for evaluation splits (they take no optimizer step).
    steps_per_epoch: int | None = None


@dataclass(kw_only=True)
class PlanStats:
    world_size: int
    global_batch: int
    splits: dict[str, SplitPlan] = field(default_factory=dict)


@dataclass(kw_only=True)
class BackendStats:
    """The kernels and the optimizer class the ranks build with (decided once here; the recipe reads them, never
    re-derives them)."""

    attention: str
    attention_reason: str
    kernels: str
    kernels_reason: str
    loss: str
    loss_reason: str
    optimizer: str
    optimizer_reason: str
    # A GQA model's k/v heads under `attention`: "native" (read as they are) or "repeated" (per query head first).
    # Empty in a preflight.json written before it was recorded.
    gqa_kv: str = ""


@dataclass(kw_only=True)
class MemoryStats:
    weights_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    total_gib: float
    kv_cache_gib: float = 0.0  # an online recipe's generation cache (within the peak, not beside it)
    device_gib: float | None = None
    # What the plan keeps in host memory (offloaded activations, FSDP CPU offload's state; every rank of the node)
    # and the host memory it was checked against (null: nothing offloaded).
    host_gib: float = 0.0
    host_memory_gib: float | None = None
    # Host memory while loading model.path (every rank of the node) and of the data workers (seqtune.preflight.host).
    host_loading_gib: float = 0.0
    host_workers_gib: float = 0.0


@dataclass(kw_only=True)
class PreflightResult:
    ok: bool
    max_seq_len: int | None
    caches: dict[str, Path] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    splits: dict[str, SplitStats] = field(default_factory=dict)
    vocab: VocabStats | None = None
    padding: PaddingStats | None = None
    plan: PlanStats | None = None
    memory: MemoryStats | None = None
    backend: BackendStats | None = None
    # Information that is not a problem (pad == eos, the resized vocab, the truncation counts).
    notes: list[str] = field(default_factory=list)
    context_length: int | None = None
    # data.mode=stream: the records one pass over the train split deals (every rank derives its micro-batches per
    # pass from it), and each source's records (the weighted mix's counts follow from them).
    stream_train_lines: int | None = None
    stream_source_records: list[int] | None = None
    # The run's rejects.jsonl (stream-mode training appends to the bad lines it finds beyond preflight's sample).
    rejects_file: Path | None = None
    # Where the validation split comes from: data.val, data.val_fraction of train, or none (seqtune.data.split).
    validation: str | None = None


def to_json(result: PreflightResult) -> dict[str, Any]:
    data = asdict(result)
    data["caches"] = {split: str(path) for split, path in result.caches.items()}
    data["rejects_file"] = None if result.rejects_file is None else str(result.rejects_file)
    return data


def write_result(result: PreflightResult, run_dir: Path) -> Path:
    # Write then rename: a rank must never read a half-written file (and a full disk names the path).
    return write_atomic(run_dir / RESULT_FILE, json.dumps(to_json(result), indent=2) + "\n", key=RUN_DIR_KEY)


def _optional(cls: type, data: dict[str, Any] | None) -> Any:
    return None if data is None else cls(**data)


def _split_stats(data: dict[str, Any]) -> SplitStats:
    return SplitStats(
        **{
            **data,
            "content": _optional(ContentStats, data.get("content")),
            "sources": [SourceStats(**source) for source in data.get("sources", [])],
        }
    )


def load_result(run_dir: Path) -> PreflightResult:
    """Read the preflight.json the parent wrote into `run_dir` (the per-rank worker calls this)."""
    data = json.loads((Path(run_dir) / RESULT_FILE).read_text())
    plan = data.get("plan")
    if plan is not None:
        plan = PlanStats(
            world_size=plan["world_size"],
            global_batch=plan["global_batch"],
            splits={name: SplitPlan(**split) for name, split in plan["splits"].items()},
        )
    return PreflightResult(
        ok=data["ok"],
        max_seq_len=data["max_seq_len"],
        caches={split: Path(path) for split, path in data["caches"].items()},
        problems=[Problem(**problem) for problem in data["problems"]],
        splits={name: _split_stats(stats) for name, stats in data["splits"].items()},
        vocab=_optional(VocabStats, data["vocab"]),
        padding=_optional(PaddingStats, data["padding"]),
        plan=plan,
        memory=_optional(MemoryStats, data["memory"]),
        backend=_optional(BackendStats, data.get("backend")),
        notes=list(data["notes"]),
        context_length=data["context_length"],
        stream_train_lines=data["stream_train_lines"],
        stream_source_records=data.get("stream_source_records"),
        rejects_file=None if data["rejects_file"] is None else Path(data["rejects_file"]),
        validation=data.get("validation"),
    )
