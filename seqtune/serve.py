"""`python -m seqtune.serve RUN_DIR [--host 127.0.0.1] [--port 8000] [--device cpu|cuda] [--engine seqtune|vllm]`
(--engine vllm: seqtune.serve_vllm hands merged/ to vLLM's own server): an OpenAI-compatible
HTTP server for a finished run's proven export (seqtune.export.engine): POST /v1/chat/completions and
/v1/completions (with "stream": true, server-sent events ending in `data: [DONE]`) and GET /v1/models. Standard
library only (http.server); one request generates at a time. It binds to 127.0.0.1 unless --host says otherwise: it
has no authentication. A request it cannot serve gets an OpenAI-shaped error body ({"error": {"message", "type",
"param", "code"}}) with status 400 (404 for an unknown path or model), never a traceback. Exits 2 when RUN_DIR
cannot be served (no proven export), 0 on SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROLES = ("system", "user", "assistant")
# OpenAI request fields this server does not implement: refused when set, never ignored (the run's trained
# terminators end every answer; a request's own stop strings, tools, logprobs or penalties would be silently lost).
UNSERVED = (
    "stop",
    "tools",
    "tool_choice",
    "functions",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "response_format",
    "presence_penalty",
    "frequency_penalty",
    "best_of",
    "echo",
    "suffix",
)
MAX_BODY = 4 * 1024 * 1024


class RequestError(Exception):
    """A request the server cannot serve: its HTTP status and OpenAI error fields."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError(f"'{name}' must be a number in [{low}, {high}], got {value!r}", param=name)
    return float(value)


def sampling(body: dict, engine: Any) -> Any:
    """The request's sampling settings, the run's generation_config.json filling what it leaves out."""
    from seqtune.export.engine import Sampling

    defaults = engine.defaults
    unserved = [name for name in UNSERVED if body.get(name) not in (None, False, 0, [], {})]
    if unserved:
        raise RequestError(f"'{unserved[0]}' is not supported by seqtune.serve; leave it out", param=unserved[0])
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) or defaults.max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError(f"'max_tokens' must be a positive integer, got {max_tokens!r}", param="max_tokens")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise RequestError(f"'seed' must be a non-negative integer, got {seed!r}", param="seed")
    if body.get("n", 1) != 1:
        raise RequestError("only n=1 is served", param="n")
    return Sampling(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", defaults.temperature, 0.0, 2.0),
        top_p=_number(body, "top_p", defaults.top_p, 0.0, 1.0) or 1.0,
        seed=seed,
    )


def chat_prompt(body: dict, engine: Any) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", param="messages")
    plain = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise RequestError(f"messages[{i}].role must be one of {', '.join(ROLES)}", param=f"messages[{i}].role")
        content = message.get("content")
        if isinstance(content, list):  # OpenAI's content parts: only text ones are served
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise RequestError(f"messages[{i}].content: only text parts are served", param=f"messages[{i}]")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string", param=f"messages[{i}].content")
        plain.append({"role": message["role"], "content": content})
    try:
        return engine.chat_ids(plain)
    except Exception as exc:  # noqa: BLE001  # the chat template refusing a conversation (a role order) is the caller's
        raise RequestError(f"the run's chat template cannot render these messages: {exc}", param="messages") from None


def completion_prompt(body: dict, engine: Any) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return engine.text_ids(prompt)
    vocab = len(engine.tokenizer)
    if isinstance(prompt, list) and prompt and all(type(t) is int and 0 <= t < vocab for t in prompt):
        return prompt
    raise RequestError("'prompt' must be a non-empty string or a list of token ids (one prompt)", param="prompt")


class Handler(BaseHTTPRequestHandler):
    engine: Any
    lock: threading.Lock
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # the stdlib's signature
        print(f"{self.address_string()} {format % args}", file=sys.stderr, flush=True)

    def do_GET(self) -> None:
        self._answer(self._get)

    def do_POST(self) -> None:
        self._answer(self._post)

    def _answer(self, route: Any) -> None:
        try:
            route()
        except (BrokenPipeError, ConnectionResetError):  # the client left (a stream it stopped reading)
            self.close_connection = True
        except RequestError as exc:
            self._json(exc.status, exc.body())
        except Exception as exc:  # noqa: BLE001  # whatever fails answers as a server error, never a traceback
            self._json(500, RequestError(f"{type(exc).__name__}: {exc}", status=500).body())

    def _get(self) -> None:
        if self.path.rstrip("/") != "/v1/models":
            raise RequestError(f"no route GET {self.path}", status=404, code="unknown_url")
        model = {"id": self.engine.name, "object": "model", "created": int(time.time()), "owned_by": "seqtune"}
        self._json(200, {"object": "list", "data": [model]})

    def _post(self) -> None:
        routes = {"/v1/chat/completions": (chat_prompt, True), "/v1/completions": (completion_prompt, False)}
        if self.path.rstrip("/") not in routes:
            raise RequestError(f"no route POST {self.path}", status=404, code="unknown_url")
        prompt_of, chat = routes[self.path.rstrip("/")]
        body = self._body()
        if body.get("model") not in (None, self.engine.name):
            raise RequestError(
                f"model {body.get('model')!r} is not served here (this server serves {self.engine.name!r})",
                param="model",
                status=404,
                code="model_not_found",
            )
        ids, settings = prompt_of(body, self.engine), sampling(body, self.engine)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("'stream' must be true or false", param="stream")
        with self.lock:
            if stream:
                self._stream(ids, settings, chat)
            else:
                tokens = list(self.engine.stream(ids, settings))
                self._json(200, _completion(self.engine, ids, tokens, chat))

    def _body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY:
            raise RequestError(f"a JSON body of 1 to {MAX_BODY} bytes is required")
        try:
            body = json.loads(self.rfile.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        return body

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, ids: list[int], settings: Any, chat: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the stream's end is the connection's
        self.end_headers()
        self.close_connection = True
        for chunk in _chunks(self.engine, ids, settings, chat):
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def _finish(engine: Any, tokens: list[int]) -> str:
    return "stop" if tokens and tokens[-1] in engine.stop_ids else "length"


def _completion(engine: Any, ids: list[int], tokens: list[int], chat: bool) -> dict:
    text = engine.text(tokens)
    choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(engine, tokens), "logprobs": None}
    choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": engine.name,
        "choices": [choice],
        "usage": {"prompt_tokens": len(ids), "completion_tokens": len(tokens), "total_tokens": len(ids) + len(tokens)},
    }


def _chunks(engine: Any, ids: list[int], settings: Any, chat: bool) -> Iterator[dict]:
    from seqtune.export.engine import text_deltas

    base = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": engine.name,
    }
    tokens: list[int] = []
    if chat:
        yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    for delta in text_deltas(engine, engine.stream(ids, settings), tokens):
        if delta:
            part: dict[str, Any] = {"delta": {"content": delta}} if chat else {"text": delta}
            yield {**base, "choices": [{"index": 0, **part, "finish_reason": None}]}
    end: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
    yield {**base, "choices": [{"index": 0, **end, "finish_reason": _finish(engine, tokens)}]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqtune.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run directory of a finished, proven seqtune run")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 = any free port)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    parser.add_argument(
        "--engine",
        choices=["seqtune", "vllm"],
        default="seqtune",
        help="vllm: vLLM's own server on merged/ (its environment: bash scripts/setup_vllm.sh)",
    )
    parser.add_argument(
        "--gguf",
        metavar="FILE|TYPE",
        default=None,
        help="serve this proven GGUF file (or RUN_DIR/gguf/<run>-TYPE.gguf) through llama.cpp instead of merged/",
    )
    args = parser.parse_args(argv)
    if args.gguf and args.device == "cuda":
        parser.error("--gguf runs in llama.cpp's CPU build (the llama-cpp-py-sync wheel): leave --device out")
    if args.engine == "vllm":
        if args.device is not None:  # vLLM's build decides its device: a --device would be ignored
            parser.error("--device is for --engine seqtune; vLLM's environment decides its device")
        if args.gguf:  # vLLM serves merged/: a GGUF named with it would be ignored
            parser.error("--gguf is served by llama.cpp (--engine seqtune); --engine vllm serves merged/")
        from seqtune.serve_vllm import serve_with_vllm

        return serve_with_vllm(args.run_dir, args.host, args.port)
    from seqtune.config.errors import SeqtuneError
    from seqtune.console import silence_known_false_alarms
    from seqtune.export.engine import Engine
    from seqtune.export.engine_gguf import GgufEngine

    silence_known_false_alarms()
    try:
        engine: Engine | GgufEngine = (
            GgufEngine(args.run_dir, args.gguf) if args.gguf else Engine(args.run_dir, device=args.device)
        )
    except SeqtuneError as err:
        print(f"seqtune.serve: error: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    handler = type("RunHandler", (Handler,), {"engine": engine, "lock": threading.Lock()})
    try:
        server = ThreadingHTTPServer((args.host, args.port), handler)
    except OSError as exc:
        print(f"seqtune.serve: error: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    host, port = str(server.server_address[0]), server.server_address[1]
    print(f"serving {args.run_dir}/{engine.artifact} as model {engine.name!r} on http://{host}:{port}/v1", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
