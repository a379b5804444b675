"""What a finished run leaves behind: the LoRA adapter (peft format) or the full model, optionally merged; and,
with early stopping, RUN_DIR/best/ (the same export of the best eval's weights), which the run ends on."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from traceback import format_exc
from typing import Any, cast

import torch

from seqtune.config.errors import SeqtuneError
from seqtune.config.rundir import BEST_DIR, RUN_DIR_KEY
from seqtune.config.schema import gguf_types
from seqtune.data.formats import chat_template_for
from seqtune.distributed import DistEnv, barrier, inject_fault
from seqtune.export.artifacts import GGUF_DIR
from seqtune.export.facts import (
    ShipFacts,
    data_files,
    ship_facts,
    shipped_config,
    stamp_stop_ids,
    write_base,
    write_card,
)
from seqtune.export.failure import REFERENCE_STEP, ExportFailure, clear_failure, record_failures
from seqtune.export.float_merge import float_merge_note, float_merged
from seqtune.export.gguf import export_run_gguf
from seqtune.export.gguf_adapter import export_adapter_gguf
from seqtune.export.proof import capture_reference, prove_exports
from seqtune.files import atomic_directory, follow_umask
from seqtune.models import save_adapter
from seqtune.models.kernels import restore_module_globals
from seqtune.models.lora import set_adapter_input_cast
from seqtune.models.vision import save_processor
from seqtune.train.loop import peak_memory_bytes
from seqtune.train.metrics import MetricsLogger

ADAPTER_DIR = "adapter"
MODEL_DIR = "model"
MERGED_DIR = "merged"


def export_final(
    model: torch.nn.Module,
    tokenizer,
    *,
    run_dir: Path,
    env: DistEnv,
    lora: bool,
    merged: bool,
    data_format: str,
    sharded: bool = False,
) -> None:
    """Rank 0 writes safetensors only; `peft.PeftModel.from_pretrained(base, run_dir/'adapter')` loads the adapter,
    `transformers.AutoModelForCausalLM.from_pretrained(run_dir/'merged')` the merged model, no seqtune needed.
    With FSDP every rank takes part in gathering the full weights first (a collective), then rank 0 writes them.
    The saved tokenizer carries the chat template of what was trained (`data_format`), or none; every export
    carries the trained stop ids, names its base and has a model card (seqtune.train.ship)."""
    facts = ship_facts(tokenizer, run_dir)
    stamp_stop_ids(model, facts.stop)
    set_adapter_input_cast(model, enabled=True)  # everything below runs the model outside autocast
    kind = ADAPTER_DIR if lora else MODEL_DIR
    target = run_dir / kind
    saved_tokenizer = trained_tokenizer(tokenizer, data_format)
    files = data_files(facts) if env.is_main else []
    if env.is_main:
        clear_failure(run_dir)
    # The trained weights first: whatever fails after them (the reference logits, merged/, GGUF, the proof) is
    # recorded for the parent, which writes finished.json before raising it (seqtune.export.failure).
    with _staged(target, env) as staging:
        save_trained(model, saved_tokenizer, staging, env=env, lora=lora, sharded=sharded, facts=facts)
        if env.is_main:
            if facts.vision is not None:  # AutoProcessor loads what expands an image as training did
                save_processor(staging, facts.vision, facts.cfg.model.path)
            write_card(facts, staging, kind, files=files)
    failures: list[ExportFailure] = []
    if env.is_main:
        if lora:
            write_base(facts, tokenizer, device=env.device)
        if (run_dir / BEST_DIR).is_dir():  # its card, now with the run's final numbers
            write_card(facts, run_dir / BEST_DIR, BEST_DIR, files=files)
        gathered = " (gathered from FSDP shards)" if sharded else ""
        print(f"saved {'LoRA adapter' if lora else 'model'}{gathered}: {target}", flush=True)
        print(f"chat template of the exports: {facts.template_note}", flush=True)
        if not sharded:  # the trained model's logits, before anything is merged into it
            _attempt(failures, REFERENCE_STEP, lambda: capture_reference(model, tokenizer, run_dir, device=env.device))
        _merged_and_gguf(
            model, saved_tokenizer, facts, files, lora=lora, merged=merged, failures=failures, device=env.device
        )
    if sharded:  # every rank's forwards gather the shards (collectives line up); the main rank keeps the logits

        def reference() -> None:
            capture_reference(model, tokenizer, run_dir, device=env.device, write=env.is_main)

        _attempt(failures if env.is_main else [], REFERENCE_STEP, reference)
    barrier()
    restore_module_globals()  # the proof loads each export as a user would: transformers' own layers, maybe on CPU
    if env.is_main and not sharded and not failures:
        _attempt(failures, "proving the exports", lambda: _prove(run_dir, env))
    elif env.is_main and sharded:
        print(
            f"export proof: run `python -m seqtune.export {run_dir}` (the sharded model was not kept on one "
            "device to compare with).",
            flush=True,
        )
    if failures:
        written = [name for name in (kind, "base", MERGED_DIR, GGUF_DIR) if (run_dir / name).exists()]
        record_failures(run_dir, failures, written)


def _prove(run_dir: Path, env: DistEnv) -> None:
    inject_fault("proof", step=0, rank=env.rank)  # test hook: SEQTUNE_FAULT=proof:0 (seqtune.distributed)
    prove_exports(run_dir, key=RUN_DIR_KEY, device=env.device)


def _merged_and_gguf(
    model: torch.nn.Module,
    tokenizer,
    facts: ShipFacts,
    files,
    *,
    lora: bool,
    merged: bool,
    failures: list,
    device: torch.device,
) -> None:
    """merged/ (LoRA: train.export_merged, or the GGUF file's source), then the GGUF file; each failure recorded."""
    run_dir = facts.run_dir
    adapter_gguf = lora and facts.cfg.train.export_gguf_adapter
    # the adapter is proven against the merged f16 file: written too when not asked for
    gguf = tuple(dict.fromkeys([*gguf_types(facts.cfg.train.export_gguf), *(["f16"] if adapter_gguf else [])]))
    if merged or (lora and gguf):  # LoRA only; a GGUF file is written from merged/ (preflight: not under FSDP)
        if not _attempt(
            failures, f"writing {MERGED_DIR}/", lambda: _write_merged(model, tokenizer, facts, files, device)
        ):
            return  # the GGUF file is written from merged/
    if gguf and _attempt(failures, f"writing {GGUF_DIR}/", lambda: export_run_gguf(run_dir, gguf, key=RUN_DIR_KEY)):
        if adapter_gguf:
            _attempt(
                failures, f"writing the adapter {GGUF_DIR}/", lambda: export_adapter_gguf(run_dir, key=RUN_DIR_KEY)
            )


def _write_merged(model: torch.nn.Module, tokenizer, facts: ShipFacts, files, device: torch.device) -> None:
    """merged/: peft's merge of the trained model; over a quantized base, the saved adapter merged into the base
    loaded as float (seqtune.export.float_merge), which peft's merge into 4-bit weights would quantize again."""
    run_dir = facts.run_dir
    if facts.quantized_base:
        merged_model = float_merged(facts, run_dir / ADAPTER_DIR, device=device)
        print(float_merge_note(facts), flush=True)
    else:
        merged_model = model.merge_and_unload()  # type: ignore[operator]  # peft's wrapper (LoRA only here)
    # A tied head trained in full (lora.modules_to_save) is no longer the embedding: say so in config.json.
    head = merged_model.get_output_embeddings()  # None: a scalar head's model has no LM head
    if head is not None and head.weight is not merged_model.get_input_embeddings().weight:
        merged_model.config.tie_word_embeddings = False
    with atomic_directory(run_dir / MERGED_DIR, key=RUN_DIR_KEY) as staging, shipped_config(merged_model):
        merged_model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if facts.vision is not None:
            save_processor(staging, facts.vision, facts.cfg.model.path)
        write_card(facts, staging, MERGED_DIR, files=files)
    print(f"saved merged model: {run_dir / MERGED_DIR}", flush=True)


def _attempt(failures: list[ExportFailure], step: str, action: Callable[[], object]) -> bool:
    """Run one step after the weights are saved; a failure is recorded (the run's weights and record stay), an
    interruption (Interrupted, KeyboardInterrupt: BaseException) still ends the run."""
    try:
        action()
    except SeqtuneError as err:  # a refusal or a failed proof: its message is the whole story
        failures.append(ExportFailure(step=step, error=str(err)))
        return False
    except Exception as exc:  # noqa: BLE001  # unexpected: kept with its traceback, the weights are saved
        failures.append(ExportFailure(step=step, error=f"{type(exc).__name__}: {exc}", details=format_exc()))
        return False
    return True


def _staged(target: Path, env: DistEnv) -> AbstractContextManager[Path]:
    """Where rank 0 writes an export directory: a temporary that replaces `target` whole when complete (nothing
    partial ever has its name). The other ranks only take part in save_trained's gather: they get `target`."""
    return atomic_directory(target, key=RUN_DIR_KEY) if env.is_main else nullcontext(target)


def save_trained(
    model: torch.nn.Module, tokenizer, target: Path, *, env: DistEnv, lora: bool, sharded: bool, facts: ShipFacts
) -> None:
    """The adapter (lora) or the whole model, with the tokenizer, written by rank 0 into `target`. Sharded: every
    rank must call it (the full weights are gathered to rank 0's CPU first, a collective). The model's config
    carries `facts.stop` (stamp_stop_ids); an adapter gets its generation_config.json and names its base."""
    state = _gathered_state(model) if sharded else None
    if env.is_main:
        with shipped_config(model):
            _write_trained(model, tokenizer, target, lora=lora, state=state, facts=facts)
        follow_umask(target)  # safetensors writes 0600 whatever the umask; teammates must be able to load it


def _write_trained(model: torch.nn.Module, tokenizer, target: Path, *, lora: bool, state, facts: ShipFacts) -> None:
    if lora:
        for config in model.peft_config.values():  # type: ignore[operator]  # peft's wrapper
            config.base_model_name_or_path = facts.base
        # `model` is peft's wrapper; save_adapter never lets peft look the base model up on a hub.
        save_adapter(model, target, state_dict=state)  # type: ignore[arg-type]
        generation = getattr(model, "generation_config", None)  # a scalar head's model generates nothing
        if generation is not None:
            generation.save_pretrained(target)
    else:
        # a transformers model; nn.Module types its methods Tensor | Module
        model.save_pretrained(target, state_dict=state, safe_serialization=True)  # type: ignore[operator]
    tokenizer.save_pretrained(target)


def _gathered_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # full_state_dict + cpu_offload: rank 0 receives the unsharded tensors on CPU, the other ranks an empty dict.
    # Plain tensors once gathered; torch types the values as any state-dict value (DTensor, ShardedTensor, ...).
    return cast(
        dict[str, torch.Tensor],
        get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)),
    )


def trained_tokenizer(tokenizer, data_format: str):
    """A copy of the tokenizer whose chat template is the one training used (a Llama 3 template saved next to an
    adapter trained on Alpaca prompts would make every chat client prompt it in a format it never saw)."""
    import copy

    saved = copy.copy(tokenizer)  # shallow: the Rust backend is shared, only the template attribute differs
    saved.chat_template = chat_template_for(data_format, tokenizer.chat_template)
    return saved


class BestWeights:
    """RUN_DIR/best/: the export (adapter, or model for a full fine-tune) of the best eval so far, replaced whole
    each time the eval improves, and read back by `restore` so the run ends on the best weights."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        run_dir: Path,
        env: DistEnv,
        lora: bool,
        sharded: bool,
        data_format: str,
    ) -> None:
        self.model, self.env, self.lora, self.sharded = model, env, lora, sharded
        self.tokenizer = trained_tokenizer(tokenizer, data_format)
        self.path = Path(run_dir) / BEST_DIR
        self.facts = ship_facts(tokenizer, run_dir)
        stamp_stop_ids(model, self.facts.stop)
        # The data files, listed at the first save (hashed by export_final's card).
        self._files: list[tuple[str, Path, str]] | None = None

    def save(self) -> Path:
        """Write the export into a locked temporary directory beside best/, then swap it in: a crash while
        writing leaves the previous best/ whole (and a .tmp-best-* that the next save sweeps away)."""
        with _staged(self.path, self.env) as staging:
            save_trained(
                self.model,
                self.tokenizer,
                staging,
                env=self.env,
                lora=self.lora,
                sharded=self.sharded,
                facts=self.facts,
            )
            if self.env.is_main:
                self._files = self._files if self._files is not None else data_files(self.facts, digests=False)
                write_card(self.facts, staging, BEST_DIR, files=self._files)
        barrier()
        return self.path

    def restore(self) -> None:
        """Load best/ into the model on every rank (all ranks read the run directory, as they read plan.json)."""
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            raise RuntimeError(f"seqtune bug: {self.path} holds no weights to restore")
        if self.lora:  # preflight refuses early stopping for LoRA under FSDP across ranks
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            # peft annotates it `-> None` but returns load_state_dict's result (missing/unexpected keys).
            result = set_peft_model_state_dict(
                self.model,  # type: ignore[func-returns-value]
                load_file(str(files[0]), device=str(self.env.device)),
            )
            _check_loaded(self.path, result.unexpected_keys, [])
        elif self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
            from torch.distributed.fsdp import FSDPModule

            # The root keeps its parameters gathered after a forward with no backward (the last eval's): shard them
            # again, so every parameter is a DTensor that takes its slice of the full weights.
            for module in self.model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()
            state: dict[str, Any] = _read_state(files) if self.env.is_main else {}
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
            set_model_state_dict(self.model, state, options=options)
        else:
            result = self.model.load_state_dict(_read_state(files), strict=False)
            # a transformers model's config; nn.Module types attributes Tensor | Module
            tied = {"lm_head.weight"} if self.model.config.tie_word_embeddings else set()  # type: ignore[union-attr]
            _check_loaded(self.path, result.unexpected_keys, [k for k in result.missing_keys if k not in tied])
        barrier()


def _read_state(files: list[Path]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {name: tensor for file in files for name, tensor in load_file(str(file)).items()}


def _check_loaded(path: Path, unexpected: list[str], missing: list[str]) -> None:
    if unexpected or missing:
        raise RuntimeError(
            f"seqtune bug: {path} does not match the model it was saved from (unexpected "
            f"{unexpected[:3]}, missing {missing[:3]})"
        )


def report_end(*, run_dir: Path, env: DistEnv, logger: MetricsLogger | None) -> None:
    """Print measured peak memory beside preflight's estimate (read from its report), so the estimate's error is
    visible."""
    from seqtune.preflight import load_result

    measured = peak_memory_bytes(env.device)
    memory = load_result(run_dir).memory if env.is_main else None
    estimate = memory.total_gib * 2**30 if memory is not None else None
    if logger is not None:
        logger.summary({"peak_memory_mb": measured / 2**20, "estimated_memory_mb": (estimate or 0) / 2**20})
        logger.close()
    if env.is_main:
        line = f"peak memory ({env.device.type}): measured {measured / 2**20:,.0f} MiB"
        if estimate:
            line += f", preflight estimate {estimate / 2**20:,.0f} MiB ({measured / estimate:.2f}x)"
            if env.device.type == "cpu":
                line += " [CPU: measured is the process's peak RSS, which includes the Python runtime and libraries]"
        print(line, flush=True)
        print(f"run directory: {run_dir}", flush=True)
