"""The post-flight proof: every artifact a run ships behaves like the model it trained.

At the end of training (before anything is merged) `capture_reference` runs the trained model on a few validation
prompts (their first target positions) and keeps its next-token logits in RUN_DIR/export_reference.safetensors.
`prove_exports` (end of training, and `python -m seqtune.export RUN_DIR`) then loads each artifact the way a user
would, with plain transformers/peft:
- adapter/ and best/ on the base their adapter_config.json names, merged/ and model/ on their own;
- the same next-token logits as the trained model on those prompts, within the coarser dtype's tolerance;
- greedy generation stops at each trained terminator: the terminator is forced as the second new token, and the
  artifact's own generation_config.json must end generation there (what was broken: bos 1 / eos 2 whatever the
  tokenizer); the unforced greedy continuation is recorded too;
- config.json and generation_config.json ask for a KV cache, and greedy tokens with the cache are those without;
- each RUN_DIR/gguf/*.gguf read back (seqtune.export.gguf.check_gguf).
A scalar head (plan.scored == "scalar", a reward model) is captured and proved by seqtune.export.score_proof
instead: validation pairs scored as training scored them, loaded with AutoModelForSequenceClassification.
Results go to RUN_DIR/export.json and the console; a failed proof raises SeqtuneError (exit 1) naming the artifact.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from seqtune.config.errors import ConfigError, SeqtuneError
from seqtune.config.rundir import RUN_DIR_KEY
from seqtune.export.artifacts import GGUF_DIR, POSITIONS, ArtifactProof, check_readable, load_artifact
from seqtune.export.facts import ShipFacts, ship_facts
from seqtune.files import atomic_output, follow_umask, write_atomic

REFERENCE_FILE = "export_reference.safetensors"
EXPORT_JSON = "export.json"
# Validation prompts compared (positions per prompt: POSITIONS).
PROMPTS = 3
# Largest |logit difference| allowed, relative to max(1, largest |reference logit|), for the coarser dtype compared.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}
# The artifacts a run may ship, in the order they are proved: directory -> what it holds.
ARTIFACTS = {"adapter": "adapter", "best": "adapter", "model": "model", "merged": "model"}
GREEDY_TOKENS = 16
# data.format=text has no prompts: a sample's first tokens stand in for one.
TEXT_PROMPT_TOKENS = 8


def reference_prompts(run_dir: Path, tokenizer: Any) -> list[Any]:
    """The first validation prompts as training tokenized them (the train split's when there is no validation)."""
    from seqtune.config.plan import load_plan
    from seqtune.data.prompts import build_eval_prompts

    plan = load_plan(run_dir)  # the run's plan: its token caches, max_seq_len and the bos the encoder added
    cache = Path(plan.caches.get("val") or plan.caches["train"])
    prompts = build_eval_prompts(
        cache,
        count=PROMPTS,
        max_seq_len=plan.max_seq_len,
        bos_id=plan.tokens.bos_id,
        stride=plan.sequences_per_sample,
        vision=plan.vision,
    )
    return prompts or _text_prompts(cache)


def _text_prompts(cache_dir: Path) -> list[Any]:
    """Samples with no prompt (data.format=text, every token a target): their first tokens are the prompt."""
    from seqtune.data.cache import TokenCache
    from seqtune.data.prompts import EvalPrompt

    cache = TokenCache.open(cache_dir)
    prompts = []
    for i in range(min(PROMPTS, len(cache))):
        ids = cache[i].input_ids.tolist()
        cut = max(1, min(TEXT_PROMPT_TOKENS, len(ids) - 1))
        prompts.append(EvalPrompt(prompt_ids=ids[:cut], reference_ids=ids[cut:], location=cache.location(i)))
    return prompts


@torch.no_grad()
def capture_reference(
    model: torch.nn.Module, tokenizer: Any, run_dir: Path, *, device: torch.device, write: bool = True
) -> Path:
    """The trained model's next-token logits on the reference prompts (a scalar head's scores of reference
    pairs), saved for every later proof. Under FSDP every rank runs the same forwards and only one writes."""
    from safetensors.torch import save_file

    model.eval()
    from seqtune.config.plan import load_plan
    from seqtune.config.recipe_spec import Scored

    if load_plan(run_dir).scored == Scored.scalar:
        from seqtune.export.score_proof import capture_scores

        tensors, locations = capture_scores(model, run_dir, device=device)
    else:
        tensors, locations = _capture_logits(model, tokenizer, run_dir, device=device)
    dtype = str(_computed_in(model, device)).removeprefix("torch.")
    path = Path(run_dir) / REFERENCE_FILE
    if not write:
        return path
    with atomic_output(path, key=RUN_DIR_KEY) as partial:
        save_file(tensors, str(partial), metadata={"dtype": dtype, "locations": json.dumps(locations)})
        follow_umask(partial)  # safetensors writes 0600
    return path


def _computed_in(model: torch.nn.Module, device: torch.device) -> torch.dtype:
    """The coarsest dtype the reference logits were computed in: the weights' dtype, or the attention's where it
    computes coarser (torch_varlen runs fp32 inputs in bf16 on CUDA; the first H100 GRPO run's fp32 adapter proof
    failed at 1.15e-4 against float32's 1e-4 for that)."""
    from seqtune.models.varlen import TORCH_VARLEN, computes_in

    dtype = next(model.parameters()).dtype
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == TORCH_VARLEN:
        attention = computes_in(dtype, torch.device(device))
        return attention if TOLERANCE.get(attention, 0) > TOLERANCE.get(dtype, 0) else dtype
    return dtype


def _capture_logits(
    model: torch.nn.Module, tokenizer: Any, run_dir: Path, *, device: torch.device
) -> tuple[dict[str, torch.Tensor], list[str]]:
    tensors, locations = {}, []
    pixels = _prompt_pixels(run_dir)
    for i, prompt in enumerate(reference_prompts(run_dir, tokenizer)):
        ids = prompt.prompt_ids + prompt.reference_ids[: POSITIONS - 1]
        first = len(prompt.prompt_ids) - 1
        tensors[f"ids.{i}"] = torch.tensor(ids, dtype=torch.int64)
        inputs = pixels(prompt, tensors[f"ids.{i}"]) if pixels is not None else {}
        tensors.update({f"{name}.{i}": value for name, value in inputs.items()})
        images = _on(_image_inputs(tensors, str(i)), device)
        logits = model(input_ids=torch.tensor([ids], device=device), **images).logits[0, first:]
        tensors[f"logits.{i}"] = logits.float().cpu().contiguous()
        locations.append(prompt.location)
    return tensors, locations


def _prompt_pixels(run_dir: Path) -> Any | None:
    """An image-text run: a prompt and its ids -> the model inputs of the images its tokens hold (pixel_values, a
    dynamic-resolution model's image_grid_thw, the image token types), so every proof
    compares logits on a prompt with its images, as the model reads them; None for a text-only run. Only the
    prompt's own images: a record's later turns may hold more, whose tokens the prompt (cut at the first target)
    does not have, and the model refuses features without their tokens."""
    from seqtune.config.plan import load_plan
    from seqtune.data.pixels import ImagePixels, image_token_types
    from seqtune.models.vision import image_processor
    from seqtune.preflight.config_rules import load_checked

    vision = load_plan(run_dir).vision
    if vision is None:
        return None
    model_path = load_checked(Path(run_dir) / "config.yaml").model.path
    pixels = ImagePixels(processor=image_processor(vision, model_path), vision=vision)

    def inputs(prompt: Any, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        if not prompt.images:
            return {}
        arrays = {**pixels(list(prompt.images)), **image_token_types(ids.numpy()[None], vision)}
        return {name: torch.from_numpy(value) for name, value in arrays.items()}

    return inputs


def _on(images: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {name: value.to(device) for name, value in images.items()}


# The image inputs a reference prompt is captured with (seqtune.data.pixels: the processor's and the token types).
IMAGE_INPUTS = ("pixel_values", "image_grid_thw", "token_type_ids", "mm_token_type_ids")


def _image_inputs(reference: dict[str, torch.Tensor], i: str) -> dict:
    """The image inputs a reference prompt was captured with (none for a prompt without images)."""
    return {name: reference[f"{name}.{i}"] for name in IMAGE_INPUTS if f"{name}.{i}" in reference}


def _tolerance(*dtypes: torch.dtype) -> float:
    return max(TOLERANCE.get(dtype, TOLERANCE[torch.bfloat16]) for dtype in dtypes)


@torch.no_grad()
def logits_agreement(
    model: torch.nn.Module, reference: dict[str, torch.Tensor], reference_dtype: torch.dtype, device: torch.device
) -> tuple[dict[str, Any], list[str]]:
    """Max |logit difference| against the trained model's, over every reference prompt and position."""
    dtype = next(model.parameters()).dtype
    tolerance = _tolerance(dtype, reference_dtype)
    worst, same_top = 0.0, True
    for key in sorted(k for k in reference if k.startswith("ids.")):
        i = key.split(".", 1)[1]
        expected = reference[f"logits.{i}"]
        ids = reference[key]
        images = _on(_image_inputs(reference, i), device)
        got = model(input_ids=ids[None].to(device), **images).logits[0, len(ids) - len(expected) :].float().cpu()
        scale = max(1.0, float(expected.abs().max()))
        worst = max(worst, float((got - expected).abs().max()) / scale)
        same_top &= bool((got.argmax(-1) == expected.argmax(-1)).all())
    checks = {
        "max_logit_difference_relative": round(worst, 8),
        "tolerance": tolerance,
        "dtype": str(dtype),
        "same_greedy_tokens": same_top,
    }
    failures = (
        []
        if worst <= tolerance
        else [
            f"its next-token logits differ from the trained model's by {worst:.3g} (relative to the largest logit) > "
            f"{tolerance:g} allowed for {str(dtype).removeprefix('torch.')}"
        ]
    )
    return checks, failures


class _ForceToken:
    """A logits processor that makes `token` the `step`-th new token (0-based) and leaves every other step alone."""

    def __init__(self, prompt_length: int, step: int, token: int) -> None:
        self.at, self.token = prompt_length + step, token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[1] == self.at:
            scores = torch.full_like(scores, float("-inf"))
            scores[:, self.token] = 0.0
        return scores


@torch.no_grad()
def stops_at_terminators(
    model: torch.nn.Module, directory: Path, facts: ShipFacts, prompt: torch.Tensor, device: torch.device
) -> tuple[dict[str, Any], list[str]]:
    """Generation with the artifact's own generation_config.json ends at each trained terminator."""
    from transformers import GenerationConfig, LogitsProcessorList

    config = GenerationConfig.from_pretrained(directory)
    config.do_sample, config.max_new_tokens = False, GREEDY_TOKENS
    listed = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    inputs = prompt[None].to(device)
    checks: dict[str, Any] = {"eos_token_id": listed, "stops": {}}
    failures = []
    for token in facts.stop.eos:
        forced = LogitsProcessorList([_ForceToken(inputs.shape[1], 1, token)])
        new = model.generate(  # type: ignore[operator]  # a transformers (or peft) model: nn.Module types it loosely
            input_ids=inputs, attention_mask=torch.ones_like(inputs), generation_config=config, logits_processor=forced
        )[0, inputs.shape[1] :].tolist()
        stopped = len(new) <= 2 and new[-1] in listed
        name = facts.stop.names.get(token, str(token))
        checks["stops"][name] = stopped
        if not stopped:
            failures.append(
                f"generation does not stop at the trained terminator {name} (id {token}): "
                f"{directory.name}/generation_config.json eos_token_id={listed}"
            )
    greedy = model.generate(
        input_ids=inputs,
        attention_mask=torch.ones_like(inputs),  # type: ignore[operator]
        generation_config=config,
    )[0, inputs.shape[1] :].tolist()
    checks["greedy_tokens"] = len(greedy)
    checks["greedy"] = greedy  # what `python -m seqtune.serve` answers greedily for this prompt
    checks["greedy_prompt"] = prompt.tolist()
    checks["greedy_stopped"] = bool(greedy) and greedy[-1] in listed
    cache_checks, cache_failures = generates_with_cache(model, directory, config, inputs, greedy)
    return {**checks, **cache_checks}, failures + cache_failures


def generates_with_cache(
    model: torch.nn.Module, directory: Path, config: Any, inputs: torch.Tensor, generated: list[int]
) -> tuple[dict[str, Any], list[str]]:
    """The shipped configs ask for a KV cache (config.json where there is one, generation_config.json always), and
    the greedy tokens generated with it are the ones recomputing the whole sequence gives. `generated`: the greedy
    tokens already generated with `config` as loaded; greedy decoding is deterministic, so they stand for that
    setting's run and only the other setting generates again."""
    failures = []
    config_json = directory / "config.json"
    said = {"generation_config.json": config.use_cache}
    if config_json.is_file():
        said["config.json"] = json.loads(config_json.read_text()).get("use_cache", True)
    for file, value in said.items():
        if value is False:
            failures.append(
                f"{directory.name}/{file} says use_cache false: generation would recompute the whole sequence "
                "for every new token"
            )
    greedy = {config.use_cache: generated} if isinstance(config.use_cache, bool) else {}
    for use_cache in (True, False):
        if use_cache in greedy:
            continue
        config.use_cache = use_cache
        greedy[use_cache] = model.generate(  # type: ignore[operator]
            input_ids=inputs, attention_mask=torch.ones_like(inputs), generation_config=config
        )[0, inputs.shape[1] :].tolist()
    if greedy[True] != greedy[False]:
        failures.append(
            f"greedy generation with the KV cache ({greedy[True]}) differs from generation without it ({greedy[False]})"
        )
    return {"use_cache": said, "cache_same_tokens": greedy[True] == greedy[False]}, failures


def prove_artifact(
    facts: ShipFacts, name: str, reference: dict[str, torch.Tensor], reference_dtype: torch.dtype, device: torch.device
) -> ArtifactProof:
    device = _room_for(facts.run_dir / name, device)
    model = load_artifact(facts, name, device=device)
    if facts.scalar:  # a scalar head generates nothing: its scores are what it ships
        from seqtune.export.score_proof import prove_scores

        checks, failures = prove_scores(model, facts.run_dir / name, reference, _tolerance(reference_dtype), device)
        return ArtifactProof(artifact=name, ok=not failures, checks=checks, failures=failures)
    logit_checks, failures = logits_agreement(model, reference, reference_dtype, device)
    stop_checks, stop_failures = stops_at_terminators(model, facts.run_dir / name, facts, reference["ids.0"], device)
    failures += stop_failures
    del model  # one artifact in memory at a time, beside the trained model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return ArtifactProof(artifact=name, ok=not failures, checks={**logit_checks, **stop_checks}, failures=failures)


def _room_for(directory: Path, device: torch.device) -> torch.device:
    """The device when it has room for the artifact (twice its weights, with the base an adapter loads on), else
    the CPU: at the end of training the trained model and its optimizer still hold the GPU."""
    if device.type != "cuda":
        return device
    weights = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    base = (
        json.loads((directory / "adapter_config.json").read_text())["base_model_name_or_path"]
        if (directory / "adapter_config.json").is_file()
        else None
    )
    if base and Path(base).is_dir():
        weights += sum(f.stat().st_size for f in Path(base).glob("*.safetensors"))
    free, _ = torch.cuda.mem_get_info(device)
    return device if free > 2 * weights else torch.device("cpu")


def prove_exports(run_dir: Path, *, key: str, device: torch.device | None = None) -> list[ArtifactProof]:
    """Prove every artifact in `run_dir`; write export.json, print one line each; raise SeqtuneError (exit 1) naming
    each artifact that fails. `key`: what a disk error names as where export.json goes."""
    from safetensors import safe_open
    from transformers import AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a "Loading weights" bar per artifact says nothing
    run_dir = Path(run_dir)
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    reference_path = run_dir / REFERENCE_FILE
    names = [name for name in ARTIFACTS if (run_dir / name).is_dir()]
    if not reference_path.is_file() or not names:
        raise ConfigError(
            f"{run_dir} holds no exported artifact with the trained model's reference logits "
            f"({REFERENCE_FILE}, written at the end of training).",
            key="RUN_DIR",
            fix="name the run directory of a training run that finished with this seqtune version.",
        )
    check_readable([reference_path])
    with safe_open(str(reference_path), framework="pt") as f:
        reference = {key: f.get_tensor(key) for key in f.keys()}  # safe_open has no iteration
        reference_dtype = getattr(torch, f.metadata()["dtype"])
    tokenizer = AutoTokenizer.from_pretrained(run_dir / names[0])
    facts = ship_facts(tokenizer, run_dir)
    proofs = [prove_artifact(facts, name, reference, reference_dtype, device) for name in names]
    proofs += [_prove_gguf(path, facts, tokenizer, run_dir) for path in sorted((run_dir / GGUF_DIR).glob("*.gguf"))]
    _report(run_dir, proofs, key=key)
    return proofs


def _prove_gguf(path: Path, facts: ShipFacts, tokenizer: Any, run_dir: Path) -> ArtifactProof:
    """A GGUF file seqtune wrote is read back; one llama.cpp quantized is run in llama.cpp; either's Modelfile is
    parsed back."""
    from seqtune.export.gguf import check_gguf, gguf_path, gguf_type
    from seqtune.export.gguf_adapter import ADAPTER_TYPE, BASE_TYPE, prove_adapter, prove_base
    from seqtune.export.modelfile import check_modelfile
    from seqtune.models.gguf_facts import WRITTEN_TYPES

    kind = gguf_type(path)
    if kind == BASE_TYPE:  # the adapter's base: its Modelfile is the adapter's
        return prove_base(path, tokenizer, reference_prompts(run_dir, tokenizer))
    if kind == ADAPTER_TYPE:
        proof = prove_adapter(path, run_dir, facts, tokenizer, reference_prompts(run_dir, tokenizer))
    elif kind in WRITTEN_TYPES:
        proof = check_gguf(path, facts)
    else:
        proof = _run_gguf(path, facts, tokenizer, run_dir)
    modelfile = check_modelfile(path, gguf_path(run_dir, BASE_TYPE) if kind == ADAPTER_TYPE else None)
    proof.checks["modelfile"] = not modelfile
    proof.failures += modelfile
    proof.ok = proof.ok and not modelfile
    return proof


def _run_gguf(path: Path, facts: ShipFacts, tokenizer: Any, run_dir: Path) -> ArtifactProof:
    """A file llama.cpp quantized: run in llama.cpp against the f16 file it was quantized from."""
    from seqtune.export.gguf import gguf_path, gguf_type
    from seqtune.export.gguf_run import prove_quantized
    from seqtune.models.gguf_facts import QUANTIZED_SOURCE

    source = gguf_path(run_dir, QUANTIZED_SOURCE)
    if not source.is_file():
        return ArtifactProof(
            artifact=f"{GGUF_DIR}/{path.name}",
            ok=False,
            failures=[f"{GGUF_DIR}/{source.name}, which it was quantized from and is compared with, is missing"],
        )
    return prove_quantized(path, source, facts, tokenizer, reference_prompts(run_dir, tokenizer), gguf_type(path))


def _report(run_dir: Path, proofs: list[ArtifactProof], *, key: str) -> None:
    body = {"ok": all(p.ok for p in proofs), "artifacts": [asdict(p) for p in proofs]}
    write_atomic(run_dir / EXPORT_JSON, json.dumps(body, indent=1).encode(), key=key)
    for proof in proofs:
        checks = proof.checks
        if "summary" in checks:  # a GGUF file's proof states its own
            detail = checks["summary"]
        elif "max_score_difference_relative" in checks:
            detail = (
                f"scores within {checks['max_score_difference_relative']:.2g} of the trained model's (tolerance "
                f"{checks['tolerance']:g}); chosen above rejected in {checks['chosen_above_rejected']} of "
                f"{checks['pairs']} pairs (the trained model: {checks['trained_chosen_above_rejected']})"
            )
        elif "max_logit_difference_relative" in checks:
            detail = (
                f"logits within {checks['max_logit_difference_relative']:.2g} of the trained model's "
                f"(tolerance {checks['tolerance']:g}, {checks['dtype'].removeprefix('torch.')}); stops at "
                f"{', '.join(n for n, ok in checks['stops'].items() if ok) or 'nothing'}"
            )
        else:
            detail = ""
        print(
            f"export proof: {proof.artifact}: {'ok' if proof.ok else 'FAILED'}: {detail}"
            + "".join(f"\n  - {failure}" for failure in proof.failures),
            flush=True,
        )
    failed = [p for p in proofs if not p.ok]
    if failed:
        raise SeqtuneError(
            f"the export proof failed for {', '.join(p.artifact for p in failed)}: "
            + "; ".join(f"{p.artifact}: {p.failures[0]}" for p in failed)
            + f". Details: {run_dir / EXPORT_JSON}."
        )
