"""preflight.show: samples.html (parsed), samples.json and the console sample, from a real run_preflight."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from test_preflight_run import make_cfg, write_jsonl

from seqtune.preflight import run_preflight
from seqtune.preflight.samples import TARGET_CLOSE, TARGET_OPEN, console_text


class Page(HTMLParser):
    """The samples of samples.html: each sample's attributes and its token spans' classes and text."""

    def __init__(self) -> None:
        super().__init__()
        self.samples: list[dict] = []
        self.legend: list[str] = []
        self.external: list[str] = []
        self._span: list[str] | None = None
        self._in_legend = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("link", "script", "img") or (tag != "a" and attrs.get("src")):
            self.external.append(tag)
        classes = (attrs.get("class") or "").split()
        if "legend" in classes:
            self._in_legend = True
        if tag == "div" and "sample" in classes:
            self.samples.append({**attrs, "tokens": []})
        if tag == "span" and "tok" in classes:
            if self._in_legend:
                self.legend.append(" ".join(classes))
            elif self.samples:
                self._span = classes
                self.samples[-1]["tokens"].append({"classes": classes, "text": "", "title": attrs.get("title")})

    def handle_endtag(self, tag):
        if tag == "div" and self._in_legend:
            self._in_legend = False
        if tag == "span":
            self._span = None

    def handle_data(self, data):
        if self._span is not None and self.samples and self.samples[-1]["tokens"]:
            self.samples[-1]["tokens"][-1]["text"] += data


@pytest.fixture(scope="module")
def shown(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("shown")
    rows = [
        {"instruction": f"Name fruit number {i}.", "input": "", "output": " ".join(["pear"] * (1 + i % 5))}
        for i in range(12)
    ]
    rows.append({"instruction": "Repeat after me: " + "one two three " * 12, "input": "", "output": "done"})
    train = write_jsonl(tmp / "train.jsonl", rows)
    val = write_jsonl(
        tmp / "val.jsonl",
        [
            {"instruction": "Name a colour.", "input": "", "output": "red"},
            {"instruction": "Name a shape.", "input": "", "output": "circle"},
        ],
    )
    cfg = make_cfg(
        tmp, train, f"data.val={val}", "data.max_seq_len=32", "data.overlength=truncate_prompt", "preflight.show=2"
    )
    result = run_preflight(cfg, tmp / "run")
    assert result.ok
    return tmp / "run"


def test_samples_html_is_self_contained_with_a_legend_and_marked_targets(shown):
    page = Page()
    page.feed((shown / "samples.html").read_text(encoding="utf-8"))
    assert page.external == []  # no script, stylesheet or image to fetch: it opens anywhere
    for kind in ("target", "prompt", "bos", "eos", "eot", "special", "cut", "elided"):
        assert any(kind in classes.split() for classes in page.legend), kind
    # train: the longest (cut), and 2 random; val: its longest and the one other sample.
    assert [s["data-split"] for s in page.samples] == ["train"] * 3 + ["val"] * 2
    for sample in page.samples:
        targets = [t for t in sample["tokens"] if "target" in t["classes"]]
        assert len(targets) == int(sample["data-targets"]) > 0
        assert "bos" in sample["tokens"][0]["classes"] and "prompt" in sample["tokens"][0]["classes"]
        # The final eos is marked as eos AND as a target, and carries its id.
        assert {"eos", "target"} <= set(targets[-1]["classes"]) and targets[-1]["title"].startswith("id 1")
        file, line = sample["data-location"].rsplit(":", 1)
        assert file == str(shown.parent / f"{sample['data-split']}.jsonl") and line.isdigit()


def test_a_truncated_sample_shows_where_its_prompt_was_cut(shown):
    page = Page()
    page.feed((shown / "samples.html").read_text(encoding="utf-8"))
    longest = page.samples[0]
    cut = [t for t in longest["tokens"] if "cut" in t["classes"]]
    assert len(cut) == 1 and longest["tokens"][1] is cut[0]  # right after bos: the prompt's oldest tokens went
    assert cut[0]["text"].endswith("tokens cut]")
    assert "".join(t["text"] for t in longest["tokens"] if "target" in t["classes"]).startswith("done")


def test_samples_json_matches_the_page_and_marks_targets_in_text(shown):
    rows = json.loads((shown / "samples.json").read_text(encoding="utf-8"))
    assert [r["why"] for r in rows] == ["longest, truncated", "random", "random", "longest", "random"]
    assert rows[0]["length"] == 32 and rows[0]["original_length"] > 32
    for row in rows:
        assert row["text"].startswith("<s>") and row["text"].endswith(f"</s>{TARGET_CLOSE}")
        assert row["text"].count(TARGET_OPEN) == 1


def test_console_shows_one_train_sample_marked_without_colour_and_in_colour():
    from seqtune.preflight.samples import ShownSample, ShownToken

    sample = ShownSample(
        split="train",
        why="random",
        location="t.jsonl:4",
        length=4,
        original_length=4,
        targets=2,
        tokens=[
            ShownToken(text="<s>", token_id=0, target=False, kind="bos"),
            ShownToken(text="Q:", token_id=9, target=False, kind="text"),
            ShownToken(text=" A", token_id=10, target=True, kind="text"),
            ShownToken(text="</s>", token_id=1, target=True, kind="eos"),
        ],
    )
    plain = console_text(sample, colour=False)
    assert "(random, t.jsonl:4, 4 tokens, 2 targets)" in plain
    assert plain.endswith(f"<s>Q:{TARGET_OPEN} A</s>{TARGET_CLOSE}")
    coloured = console_text(sample, colour=True)
    assert "\x1b[42;30m A\x1b[0m" in coloured and "\x1b[1;44;97m<s>\x1b[0m" in coloured and TARGET_OPEN not in coloured


def test_a_long_sample_shows_its_head_and_its_tail(shown, monkeypatch):
    from transformers import AutoTokenizer

    from seqtune.data.cache import TokenCache
    from seqtune.preflight import samples
    from seqtune.tokenizers import BUNDLED_DIR

    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_DIR)
    kinds = samples.TokenKinds(bos=0, eos=1, eot=frozenset(), control=frozenset({0, 1}))
    cache = TokenCache.open(json.loads((shown / "preflight.json").read_text())["caches"]["train"])
    longest = int(cache.lengths.argmax())
    whole = samples.render(
        cache, longest, split="train", why="longest", max_seq_len=1000, policy="error", tokenizer=tokenizer, kinds=kinds
    )
    monkeypatch.setattr(samples, "MAX_SHOWN_TOKENS", 10)
    short = samples.render(
        cache, longest, split="train", why="longest", max_seq_len=1000, policy="error", tokenizer=tokenizer, kinds=kinds
    )
    assert [t.kind for t in short.tokens].count("elided") == 1 and len(short.tokens) == 11
    assert short.tokens[5].text == f"[{whole.length - 10} tokens not shown]"
    assert [t.token_id for t in short.tokens[-5:]] == [t.token_id for t in whole.tokens[-5:]]
    assert (short.length, short.targets) == (whole.length, whole.targets)
