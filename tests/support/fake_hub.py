"""A Hugging Face Hub on loopback for push tests: the endpoints huggingface_hub's HfApi calls for `create_repo`
and `upload_folder`, read from its source (hf_api.py, _commit_api.py, _upload_pipeline.py), and nothing else.

- POST /api/repos/create (JSON: name, organization, visibility) -> {"url"}
- POST /api/validate-yaml (a README.md's metadata, checked before upload) -> {}, or 400 for a `base_model` that is
  not a Hub id, as the Hub answers (`"base_model" with value "/local/path" is not valid`)
- POST /api/models/ORG/NAME/preupload/main -> every file "regular": its bytes travel base64 inside the commit, so
  neither Xet (hf_xet's pipeline only uploads files the server marks "lfs") nor the LFS batch API is used (the
  client forces no file to LFS; it only forces empty files to "regular")
- POST /api/models/ORG/NAME/commit/main (NDJSON: a header line, then one line per file) -> {"commitUrl", "commitOid"}
Every request is recorded with its Authorization header; a request for another host (a proxied absolute URL or a
CONNECT, which the test's HTTP(S)_PROXY sends here) is recorded as foreign and refused. `refuse=401` answers every
request with that status. The server runs in a thread on 127.0.0.1 and an ephemeral port until `close()`.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Authorization)
    repos: dict[str, dict[str, Any]] = field(default_factory=dict)  # repo id -> create_repo's payload
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # repo id -> path -> bytes
    foreign: list[str] = field(default_factory=list)


class FakeHub:
    def __init__(self, *, refuse: int | None = None) -> None:
        self.received = Received()
        self.refuse = refuse
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_CONNECT(self) -> None:
                hub.received.foreign.append(f"CONNECT {self.path}")
                self._answer(403, {"error": "fake hub: no other host"})

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def _serve(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.path.startswith("/"):  # an absolute URL: a proxied request for another host
                    hub.received.foreign.append(f"{method} {self.path}")
                    return self._answer(403, {"error": "fake hub: no other host"})
                hub.received.requests.append((method, self.path, self.headers.get("Authorization")))
                if hub.refuse:
                    return self._answer(hub.refuse, {"error": "Invalid credentials in Authorization header"})
                parts = self.path.split("?")[0].strip("/").split("/")
                if method == "POST" and parts == ["api", "repos", "create"]:
                    payload = json.loads(body)
                    repo = f"{payload['organization']}/{payload['name']}"
                    hub.received.repos[repo] = payload
                    return self._answer(200, {"url": f"{hub.url}/{repo}"})
                if method == "POST" and parts == ["api", "validate-yaml"]:
                    base = re.search(r"^base_model: (.*)$", json.loads(body)["content"].split("\n---")[0], re.M)
                    if base and not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", base[1].strip()):
                        message = f'"base_model" with value "{base[1].strip()}" is not valid.'
                        return self._answer(400, {"error": message, "errors": [{"message": message}]})
                    return self._answer(200, {})
                if method == "POST" and len(parts) == 6 and parts[:2] == ["api", "models"]:
                    repo, action = f"{parts[2]}/{parts[3]}", parts[4]
                    if action == "preupload":
                        files = json.loads(body)["files"]
                        modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                        return self._answer(200, {"files": modes})
                    if action == "commit":
                        stored = hub.received.files.setdefault(repo, {})
                        for line in body.decode().splitlines():
                            item = json.loads(line)
                            if item["key"] == "file":
                                stored[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                        return self._answer(
                            200, {"commitUrl": f"{hub.url}/{repo}/commit/{'0' * 40}", "commitOid": "0" * 40}
                        )
                self._answer(404, {"error": f"fake hub: no endpoint {method} {self.path}"})

            def _answer(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
