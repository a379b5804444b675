"""What a GRPO run shows its user (torch-free): completions.jsonl, one line per completion sampled at an eval (its
step, prompt, completion, weighted reward and each function's), and samples.html's section of them, one table per
eval step, rewritten from completions.jsonl at every eval (so a resumed run's page is the uninterrupted run's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seqtune.preflight.samples_html import SAMPLES_HTML, Table, add_section, tables_section

COMPLETIONS_FILE = "completions.jsonl"
SECTION = "completions"


def _text(value: Any) -> str:
    """A prompt or completion as written: a string, or a message list as its conversation (one `role: content`
    paragraph per message); anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return "\n\n".join(f"{m['role']}: {m['content']}" for m in value)
    return json.dumps(value, ensure_ascii=False)


def episode_text(row: dict[str, Any]) -> str:
    """An agent's episode turn by turn (its completion, then each call, result and error), else the completion."""
    if not row.get("turns"):
        return _text(row["completion"])
    parts = []
    for i, turn in enumerate(row["turns"], 1):
        parts.append(f"turn {i}: {turn['completion']}")
        parts += [f"  call: {json.dumps(call, ensure_ascii=False)}" for call in turn["calls"]]
        parts += [f"  result: {result}" for result in turn["results"]]
        parts += [f"  error: {error}" for error in turn["errors"]]
    if row.get("truncated_episode"):
        parts.append("(ended by a budget: rollout.max_turns, max_completion_tokens or max_tool_tokens)")
    return "\n".join(parts)


def _number(value: float | None) -> str:
    return "none" if value is None else f"{value:.4f}"


def completion_tables(rows: list[dict[str, Any]]) -> list[Table]:
    names = list(dict.fromkeys(name for row in rows for name in row["rewards"]))
    tables = []
    for step in dict.fromkeys(row["step"] for row in rows):
        cells = [
            [
                _text(row["prompt"]),
                episode_text(row),
                _number(row["reward"]),
                *(_number(row["rewards"].get(n)) for n in names),
            ]
            for row in rows
            if row["step"] == step
        ]
        tables.append(
            Table(
                heading=f"step {step}",
                anchor=f"step-{step}",
                columns=("prompt", "completion", "reward", *names),
                rows=cells,
                text_columns=2,
            )
        )
    return tables


def show_completions(path: Path) -> Path:
    """samples.html beside `path` (completions.jsonl) with a table per eval step of its completions."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    section = tables_section(
        SECTION,
        "completions at each eval",
        f"Each eval's prompts (rank 0's), their completions sampled by that step's weights and the reward of each "
        f"({COMPLETIONS_FILE}, weighted reward first, then each function's)",
        completion_tables(rows),
    )
    return add_section(path.parent / SAMPLES_HTML, SECTION, section, title="seqtune: completions")
