"""The second wave of preflight's checks as two phases: what the labels and the data text hold, against the
tokenizer's and the checkpoint's own files. Gathers plain values and calls checks_labels.py / checks_model.py.

`file_checks` needs no data (it runs with the fast checks); `content_checks` runs once the scan has written each
split's token cache, reading it through seqtune.preflight.observe (one numpy pass, stored beside the cache).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from seqtune.config.plan import Resolved, Tokens
from seqtune.config.schema import RootConfig
from seqtune.data.kinds import sample_kind
from seqtune.data.overlength import TRUNCATING, cut_sample
from seqtune.data.scan import SplitScan
from seqtune.data.types import DUPLICATE, IGNORE_INDEX
from seqtune.models.checkpoint_facts import (
    config_bos_eos,
    generation_stop_ids,
    read_token_rows,
    rope_facts,
)
from seqtune.models.model_configs import ModelConfigs
from seqtune.preflight import checks_labels as labels
from seqtune.preflight import checks_model as model_checks
from seqtune.preflight import samples
from seqtune.preflight.checks import Problem
from seqtune.preflight.observe import Finding, SplitObservations, observe_split
from seqtune.preflight.result import ContentStats, PreflightResult
from seqtune.preflight.samples_html import SAMPLES_HTML, write_html
from seqtune.preflight.tokens_text import TextProof, stored_text_proof
from seqtune.tokenizers.location import resolve_location

if TYPE_CHECKING:
    from seqtune.preflight.tokenizer_record import RunTokenizer

# Ordinary-token rows read beside the special ones: the scale an untrained row is compared with.
REFERENCE_ROWS = 16
# tokenizer.json writes its presets right after "version": they are within the first bytes of any size of file.
PRESET_HEAD_BYTES = 1 << 16


def file_checks(cfg: RootConfig, plan: Resolved, tokenizer: RunTokenizer, model: ModelConfigs | None) -> list[Problem]:
    """Before the scan: presets in tokenizer.json; with a checkpoint, the tokenizer's bos/eos against its config."""
    location = resolve_location(cfg.tokenizer, cfg.model)
    source = location.directory / "tokenizer.json"
    truncation, padding = tokenizer.record.presets
    problems = model_checks.check_tokenizer_presets(
        truncation=truncation, padding=padding, source=str(source), key=location.key
    )
    if cfg.model.path and model is not None and model.hf_config is not None:
        bos, eos = config_bos_eos(model.hf_config)
        problems += model_checks.check_bos_eos_ids(
            tokenizer_bos=tokenizer.record.bos_token_id,
            tokenizer_eos=plan.vocab.eos_id,
            config_bos=bos,
            config_eos=eos,
            source=str(Path(cfg.model.path) / "config.json"),
        )
    return problems


def tokenizer_presets(path: Path, tokenizer: Any) -> tuple[dict | None, dict | None]:
    """The "truncation" and "padding" tokenizer.json states (read from the file's head, not its megabytes of
    vocabulary); the loaded backend's state when the file is not there or not in the usual order."""
    if path.is_file():
        with path.open("r", encoding="utf-8", errors="replace") as f:
            head = f.read(PRESET_HEAD_BYTES)
        found = {}
        for name in ("truncation", "padding"):
            key = re.search(rf'"{name}"\s*:\s*', head)
            try:
                found[name] = json.JSONDecoder().raw_decode(head, key.end())[0] if key else None
            except ValueError:  # cut off by the head: fall back to the backend's state
                key = None
            if key is None:
                break
        if len(found) == 2:
            return found["truncation"], found["padding"]
    backend = tokenizer.backend_tokenizer
    return backend.truncation, backend.padding


def _tokenizer_key(cfg: RootConfig) -> str:
    """The tokenizer.* key that chose the tokenizer (tokenizer.path when it is model.path's)."""
    key = resolve_location(cfg.tokenizer, cfg.model).key
    return key if key.startswith("tokenizer.") else "tokenizer.path"


def content_checks(
    cfg: RootConfig,
    plan: Resolved,
    tokens: Tokens,
    tokenizer: RunTokenizer,
    model: ModelConfigs | None,
    scans: dict[str, SplitScan],
    max_seq_len: int,
    result: PreflightResult,
) -> list[Problem]:
    """After the scan: every split's labels and text, duplicates within and across splits, stop tokens, untrained
    special rows and the pretraining context. Fills result.splits[name].content and result.notes. Each split is
    judged by its sources' own formats (SplitScan.formats), never by data.format."""
    seen = {name: _observe(plan, tokenizer, tokens, scan, cfg.data.media_root) for name, scan in scans.items()}
    k = plan.sequences_per_sample
    train = (scans["train"], sample_hashes(seen["train"].hashes(), k)) if "train" in seen else None
    problems: list[Problem] = []
    for name, scan in scans.items():
        split = _SplitContent(cfg, plan, tokens, tokenizer, scan, seen[name], max_seq_len, result)
        problems += split.check(train if name != "train" else None)
    result.notes += [f"model facts ({fact}): {source}" for fact, source in plan.fact_sources.items()]
    if tokens.templated:
        result.notes += [note] if (note := tokenizer.record.earlier_turns_note) else []
    if model is None:
        return problems
    return problems + _model_checks(cfg, plan, model, seen, tokenizer, tokens, max_seq_len, result)


def _observe(
    plan: Resolved, tokenizer: RunTokenizer, tokens: Tokens, scan: SplitScan, media_root: Any
) -> SplitObservations:
    """One pass over the split's token cache. Token ids given as such (a pre-tokenized format) hold no text to
    check for literal control strings; <img> references are images only in formats that read them."""
    text = not all(fmt.pretokenized for fmt in scan.formats)
    return observe_split(
        scan.cache_dir,
        control=tokenizer.record.control,
        literal=tokenizer.record.literal if text else {},
        bos_id=tokens.bos_id,
        scan_text=text,
        space_ids=tokenizer.record.spaces,
        reasoning=tokenizer.record.reasoning,
        image_references=plan.vision is not None and any(fmt.image_references for fmt in scan.formats),
        image_placeholder=sample_kind(plan.sample_kind).image_placeholder(plan.vision),
        media_root=media_root,
    )


@dataclass
class _SplitContent:
    """The content checks of one split, read from its observations and its sources' formats."""

    cfg: RootConfig
    plan: Resolved
    tokens: Tokens
    tokenizer: RunTokenizer
    scan: SplitScan
    observed: SplitObservations
    max_seq_len: int
    result: PreflightResult

    def check(self, train: tuple[SplitScan, np.ndarray] | None) -> list[Problem]:
        name, observed, ends = self.scan.name, self.observed, self.tokens.terminators
        # A kind whose targets are anchors only (prompts: the completions are generated) ends no reply in its data.
        trains = sample_kind(self.plan.sample_kind).trains_targets
        problems: list[Problem] = []
        if trains:
            problems += labels.check_turn_terminators(
                split=name, templated=self.tokens.templated, run_ends=observed.run_ends, terminators=ends
            )
        problems += labels.check_literal_controls(
            split=name, per_token=observed.literal_controls, lines=observed.literal_lines
        )
        formats = self.scan.formats
        proof = None if all(fmt.pretokenized for fmt in formats) else self._text_proof(problems)
        bos_id = self.tokens.bos_id
        if any(fmt.pretokenized for fmt in formats) and bos_id is not None:
            control = self.tokenizer.record.control
            problems += labels.check_double_bos(split=name, double_bos=observed.double_bos, bos=control[bos_id])
        cut = terminator_cut(self.scan, self.max_seq_len, self.cfg.data.overlength, ends)
        if trains:
            problems += labels.check_terminator_cut(
                split=name,
                policy=self.cfg.data.overlength,
                prompt_free=all(fmt.prompt_free for fmt in formats),
                cut=cut,
            )
        duplicates = self._duplicates(train, problems)
        if name in self.result.splits:
            control = self.tokenizer.record.control
            self.result.splits[name].content = stats = _stats(observed, control, ends, cut, duplicates)
            if not trains:  # a prompt ends no reply: no span is "unterminated"
                stats.unterminated_spans = None
            if proof is not None:
                stats.text_checked, stats.text_mismatched = proof.checked, proof.mismatched.count
        return problems

    def _text_proof(self, problems: list[Problem]) -> TextProof:
        """The stored tokens decoded against the records' own text (a format with text)."""
        cfg, name = self.cfg, self.scan.name
        proof = stored_text_proof(
            self.scan.cache_dir,
            self.tokenizer.load,
            train_on_prompt=cfg.data.train_on_prompt,
            media_root=cfg.data.media_root,
            vision=self.plan.vision,
        )
        problems += labels.check_tokens_text(
            split=name,
            checked=proof.checked,
            samples=proof.samples,
            mismatched=proof.mismatched,
            first_difference=proof.first_difference,
            tokenizer_key=_tokenizer_key(cfg),
        )
        if not proof.mismatched.count:
            self.result.notes += labels.tokens_text_note(split=name, checked=proof.checked, samples=proof.samples)
        return proof

    def _duplicates(
        self, train: tuple[SplitScan, np.ndarray] | None, problems: list[Problem]
    ) -> tuple[int, int | None]:
        """Copies within the split and of train samples: problems and notes; the counts."""
        cfg, scan, name, k = self.cfg, self.scan, self.scan.name, self.plan.sequences_per_sample
        duplicates, duplicate_problems = _duplicates(cfg, scan, sample_hashes(self.observed.hashes(), k), k, train)
        problems += duplicate_problems
        for copies, of in ((duplicates[0], None), (duplicates[1], "train")):
            self.result.notes += labels.duplicate_notes(
                split=name, samples=self.observed.samples // k, copies=copies or 0, of=of, policy=cfg.data.duplicates
            )
        first_dropped = next((r for r in scan.rejects if r.code == DUPLICATE), None)
        self.result.notes += labels.dropped_duplicates_note(
            split=name,
            records=scan.records,
            dropped=scan.reject_counts.get(DUPLICATE, 0),
            first=f"{first_dropped.file}:{first_dropped.line}, {first_dropped.reason.split(': ', 1)[1]}"
            if first_dropped
            else None,
        )
        return duplicates


def _model_checks(
    cfg: RootConfig,
    plan: Resolved,
    model: ModelConfigs,
    seen: dict[str, SplitObservations],
    tokenizer: RunTokenizer,
    tokens: Tokens,
    max_seq_len: int,
    result: PreflightResult,
) -> list[Problem]:
    """What the checkpoint says against the data: untrained special rows, stop tokens, the RoPE context."""
    problems: list[Problem] = []
    if "train" in seen and model.hf_config is not None:
        control, ends = tokenizer.record.control, tokens.terminators
        problems += _checkpoint_checks(cfg, plan, model.hf_config, seen["train"], control, ends)
    # A checkpoint's RoPE as transformers reads its config; a tiny model's from its family's kwargs.
    original, rope_type, factor = rope_facts(model.hf_config if model.hf_config is not None else model.arch)
    rope_problems, notes = model_checks.check_rope_context(
        max_seq_len=max_seq_len,
        context_length=plan.context_length,
        original=original,
        rope_type=rope_type,
        factor=factor,
    )
    result.notes += notes
    return problems + rope_problems


def terminator_cut(scan: SplitScan, max_seq_len: int, policy: str, ends: dict[int, str]) -> Finding:
    """Over-length samples that end on a trained terminator and lose it to the policy's cut. (A sample left with no
    target at all is dropped, not trained without its end; one that never ended on a terminator loses nothing.)"""
    cut = Finding()
    if policy not in TRUNCATING:
        return cut
    cache = scan.cache()
    for i in np.flatnonzero(scan.lengths > max_seq_len):
        original = cache[int(i)]
        if not _ends_on(original, ends):
            continue
        sample = cut_sample(original, max_seq_len, policy)
        if (sample.labels != IGNORE_INDEX).any() and not _ends_on(sample, ends):
            cut.add(1, [sample.location])
    return cut


def _ends_on(sample, ends: dict[int, str]) -> bool:
    targets = np.flatnonzero(sample.labels != IGNORE_INDEX)
    return bool(len(targets)) and int(sample.input_ids[targets[-1]]) in ends


def sample_hashes(hashes: np.ndarray, k: int) -> np.ndarray:
    """One 64-bit hash per sample from its k sequences' hashes (a pair is a copy only when both sides are)."""
    if k == 1 or not len(hashes):
        return hashes
    rows = hashes.reshape(-1, k)
    combined = rows[:, 0].copy()
    for j in range(1, k):  # an order-dependent mix: (chosen, rejected) differs from (rejected, chosen)
        combined = (combined * np.uint64(0x9E3779B97F4A7C15)) ^ rows[:, j]
    return combined


def _duplicates(
    cfg: RootConfig, scan: SplitScan, hashes: np.ndarray, k: int, train: tuple[SplitScan, np.ndarray] | None
) -> tuple[tuple[int, int | None], list[Problem]]:
    """Exact copies within the split and, for val/test, of train samples: ((within, of train), problems).
    `hashes`: one per sample; sample i's location is its first sequence's."""
    cache = scan.cache()
    copies, originals = labels.duplicate_copies(hashes)
    examples = [
        f"{cache.location(int(c) * k)} (= line {cache.location(int(o) * k).rsplit(':', 1)[1]})"
        for c, o in zip(copies[: labels.MAX_LISTED], originals[: labels.MAX_LISTED], strict=True)
    ]
    problems = labels.check_duplicates(
        split=scan.name,
        samples=len(hashes),
        copies=len(copies),
        examples=examples,
        of=None,
        policy=cfg.data.duplicates,
    )
    if train is None:
        return (len(copies), None), problems
    train_scan, train_hashes = train
    hits, train_index = labels.found_in(hashes, train_hashes)
    train_cache = train_scan.cache()
    examples = [
        f"{cache.location(int(h) * k)} (= {train_cache.location(int(t) * k)})"
        for h, t in zip(hits[: labels.MAX_LISTED], train_index[: labels.MAX_LISTED], strict=True)
    ]
    problems += labels.check_duplicates(
        split=scan.name,
        samples=len(hashes),
        copies=len(hits),
        examples=examples,
        of="train",
        policy=cfg.data.duplicates,
    )
    return (len(copies), len(hits)), problems


def _stats(
    observed: SplitObservations,
    control: dict[int, str],
    ends: dict[int, str],
    cut: Finding,
    duplicates: tuple[int, int | None],
) -> ContentStats:
    masked, unterminated = labels.classify_spans(observed.run_ends, ends)
    used = set(observed.control_inputs) | set(observed.control_targets)
    return ContentStats(
        target_spans=observed.turns,
        span_ends=labels.describe_classes(observed.run_ends, control),
        trained_terminators={ends[t]: n for t, n in labels.trained_terminators(observed.control_targets, ends).items()},
        masked_terminators=sum(f.count for f in masked.values()),
        unterminated_spans=unterminated.count,
        special_tokens={
            control[t]: {"inputs": observed.control_inputs.get(t, 0), "targets": observed.control_targets.get(t, 0)}
            for t in sorted(used)
        },
        literal_special_lines=observed.literal_lines.count,
        double_bos=observed.double_bos.count,
        terminator_cut=cut.count,
        duplicates=duplicates[0],
        duplicates_of_train=duplicates[1],
    )


def _checkpoint_checks(
    cfg: RootConfig,
    plan: Resolved,
    hf_config: Any,
    train: SplitObservations,
    control: dict[int, str],
    ends: dict[int, str],
) -> list[Problem]:
    """With a local checkpoint: the trained terminators stop generation, and the special rows the data uses were
    trained (or train now)."""
    if not cfg.model.path:
        return []
    trained = labels.trained_terminators(train.control_targets, ends)
    stop_ids, source = generation_stop_ids(Path(cfg.model.path), hf_config)
    problems = model_checks.check_stop_tokens(trained=trained, names=control, stop_ids=stop_ids, source=source)
    tied = plan.tied_embeddings
    inputs, targets = sorted(train.control_inputs), sorted(train.control_targets)
    rows = read_token_rows(
        Path(cfg.model.path),
        {"embedding": sorted(set(inputs) | set(targets) if tied else inputs), "head": targets},
        _reference_ids(plan.vocab.embedding_rows, control),
    )
    embedding_trained, head_trained = _rows_trained(cfg, plan)
    matrices = [
        model_checks.MatrixRows(
            module=module,
            tensor=rows[matrix].tensor,
            use=use,
            trained=trained_now,
            found=model_checks.untrained_rows(rows[matrix].rows, rows[matrix].reference),
        )
        for matrix, module, use, trained_now in (
            ("embedding", "embed_tokens", "inputs" + (" or targets" if tied else ""), embedding_trained),
            ("head", "lm_head", "targets", head_trained),
        )
        if matrix in rows
    ]
    problems += model_checks.check_untrained_rows(matrices=matrices, names=control, source=cfg.model.path)
    return problems


def _reference_ids(rows: int, control: dict[int, str]) -> list[int]:
    """Ordinary token ids spread over the vocabulary's first half (never a control token)."""
    candidates = np.linspace(min(256, rows // 4), max(rows // 2, 1), REFERENCE_ROWS * 2).astype(int)
    return [int(i) for i in dict.fromkeys(candidates.tolist()) if int(i) not in control][:REFERENCE_ROWS]


def _rows_trained(cfg: RootConfig, plan: Resolved) -> tuple[bool, bool]:
    """Whether the embedding and the head train (full fine-tuning; the plan's modules trained in full, a tied pair
    being one matrix; LoRA on the head)."""
    if not cfg.lora.enabled:
        return True, True
    embedding = "embed_tokens" in plan.lora_saved
    head = "lm_head" in plan.lora_saved or "lm_head" in plan.lora_modules
    return embedding, head


def show_samples(
    cfg: RootConfig,
    plan: Resolved,
    tokens: Tokens,
    tokenizer: RunTokenizer,
    scans: dict[str, SplitScan],
    max_seq_len: int,
    run_dir: Path,
    store: Path,
) -> list[samples.ShownSample]:
    """preflight.show: write samples.html and samples.json into the run directory and print one sample. `store`:
    where the decoded samples are kept for a re-run (samples.collect_stored)."""
    control = tokenizer.record.control
    eos = tokens.eos_id
    kinds = samples.TokenKinds(
        bos=tokens.bos_id, eos=eos, eot=frozenset(set(tokens.terminators) - {eos}), control=frozenset(control)
    )
    shown = samples.collect_stored(
        store,
        scans,
        max_seq_len=max_seq_len,
        policy=cfg.data.overlength,
        show=cfg.preflight.show,
        seed=cfg.train.seed,
        load_tokenizer=tokenizer.load,
        kinds=kinds,
        members=sample_kind(plan.sample_kind).members,
        trains=sample_kind(plan.sample_kind).trains_targets,
    )
    samples.write_json(shown, run_dir / samples.SAMPLES_JSON)
    summary = (
        f"{run_dir} · model.family={cfg.model.family} · data.format={cfg.data.format} · "
        f"max_seq_len={max_seq_len} · data.overlength={cfg.data.overlength} · "
        f"preflight.show={cfg.preflight.show} random sample(s) per split, plus the longest and a truncated one"
    )
    write_html(shown, run_dir / SAMPLES_HTML, title="seqtune: what the model will be trained on", summary=summary)
    samples.print_sample(shown)
    return shown
