"""samples.html's completions section (rollout/completions.py on the shared page's tables): one table per eval
step, every prompt and completion escaped, message prompts as a conversation, and each eval replacing the section (not
adding a second one) below preflight's samples."""

from __future__ import annotations

import json
from pathlib import Path

from seqtune.preflight.samples_html import SAMPLES_HTML, page
from seqtune.rollout.completions import COMPLETIONS_FILE, show_completions


def write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def row(step: int, prompt, completion: str, reward: float | None) -> dict:
    return {"step": step, "prompt": prompt, "completion": completion, "reward": reward, "rewards": {"fmt": reward}}


def test_each_eval_is_a_table_of_escaped_prompts_completions_and_rewards(tmp_path):
    (tmp_path / SAMPLES_HTML).write_text(page([], title="preflight", summary="s"))
    completions = tmp_path / COMPLETIONS_FILE
    write_rows(completions, [row(2, "<b>hi</b>", "<script>x</script>", 0.5)])
    show_completions(completions)
    write_rows(
        completions,
        [
            row(2, "<b>hi</b>", "<script>x</script>", 0.5),
            row(4, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a & b"}], "ok", None),
        ],
    )
    html = show_completions(completions).read_text()
    assert html.startswith("<!doctype html>") and "<title>preflight</title>" in html and html.endswith("</html>\n")
    assert html.count('<section id="completions">') == 1 and 'id="step-2"' in html and 'id="step-4"' in html
    assert "<script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html and "&lt;b&gt;hi&lt;/b&gt;" in html
    assert "system: be brief\n\nuser: a &amp; b" in html and "&quot;content&quot;" not in html  # a conversation
    assert "<th>fmt</th>" in html and '<td class="num">0.5000</td>' in html and '<td class="num">none</td>' in html


def test_without_preflights_page_the_completions_get_a_page_of_their_own(tmp_path):
    completions = tmp_path / COMPLETIONS_FILE
    write_rows(completions, [row(1, "p", "c", 1.0)])
    html = show_completions(completions).read_text()
    assert html.count("<html") == 1 and 'id="step-1"' in html
