"""What a finished run leaves behind: the LoRA adapter (peft format) or the full model, optionally merged."""

from __future__ import annotations

from pathlib import Path

import torch

from seqtune.data.formats import chat_template_for
from seqtune.distributed import DistEnv, barrier
from seqtune.files import follow_umask
from seqtune.models import save_adapter
from seqtune.train.loop import peak_memory_bytes
from seqtune.train.metrics import MetricsLogger

ADAPTER_DIR = "adapter"
MODEL_DIR = "model"
MERGED_DIR = "merged"


def export_final(model: torch.nn.Module, tokenizer, *, run_dir: Path, env: DistEnv, lora: bool, merged: bool,
                 data_format: str, sharded: bool = False) -> None:
    """Rank 0 writes safetensors only; `peft.PeftModel.from_pretrained(base, run_dir/'adapter')` loads the adapter,
    `transformers.AutoModelForCausalLM.from_pretrained(run_dir/'merged')` the merged model, no seqtune needed.
    With FSDP every rank takes part in gathering the full weights first (a collective), then rank 0 writes them.
    The saved tokenizer carries the chat template of what was trained (`data_format`), or none."""
    tokenizer = _with_trained_template(tokenizer, data_format)
    if sharded:
        _export_gathered(model, tokenizer, run_dir=run_dir, env=env, lora=lora)
        return
    if env.is_main:
        target = run_dir / (ADAPTER_DIR if lora else MODEL_DIR)
        if lora:
            save_adapter(model, target)  # never lets peft look the base model up on a hub
        else:
            model.save_pretrained(target, safe_serialization=True)
        tokenizer.save_pretrained(target)
        follow_umask(target)  # safetensors writes 0600 whatever the umask; teammates must be able to load it
        print(f"saved {'LoRA adapter' if lora else 'model'}: {target}", flush=True)
        if merged:  # LoRA only: the schema refuses it for a full fine-tune, preflight under FSDP across ranks
            model.merge_and_unload().save_pretrained(run_dir / MERGED_DIR, safe_serialization=True)
            tokenizer.save_pretrained(run_dir / MERGED_DIR)
            follow_umask(run_dir / MERGED_DIR)
            print(f"saved merged model: {run_dir / MERGED_DIR}", flush=True)
    barrier()


def _with_trained_template(tokenizer, data_format: str):
    """A copy of the tokenizer whose chat template is the one training used (a Llama 3 template saved next to an
    adapter trained on Alpaca prompts would make every chat client prompt it in a format it never saw)."""
    import copy

    saved = copy.copy(tokenizer)  # shallow: the Rust backend is shared, only the template attribute differs
    saved.chat_template = chat_template_for(data_format, tokenizer.chat_template)
    return saved


def report_end(*, run_dir: Path, env: DistEnv, preflight, logger: MetricsLogger | None) -> None:
    """Print measured peak memory beside preflight's estimate, so the estimate's error is visible."""
    measured = peak_memory_bytes(env.device)
    estimate = preflight.memory.total_gib * 2**30 if preflight.memory is not None else None
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


def _export_gathered(model: torch.nn.Module, tokenizer, *, run_dir: Path, env: DistEnv, lora: bool) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # full_state_dict + cpu_offload: rank 0 receives the unsharded tensors on CPU, the other ranks an empty dict.
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.is_main:
        target = run_dir / (ADAPTER_DIR if lora else MODEL_DIR)
        if lora:
            model.save_pretrained(target, state_dict=state, safe_serialization=True, save_embedding_layers=False)
        else:
            model.save_pretrained(target, state_dict=state, safe_serialization=True)
        tokenizer.save_pretrained(target)
        follow_umask(target)
        print(f"saved {'LoRA adapter' if lora else 'model'} (gathered from FSDP shards): {target}", flush=True)
    barrier()
