"""An Ollama Modelfile beside each GGUF file (`ollama create NAME -f gguf/<run>-<type>.Modelfile`): FROM the file,
the trained chat template as Ollama's TEMPLATE (a Go template over .Messages) and each trained terminator as
`PARAMETER stop`.

The Jinja chat template is not translated construct by construct (Go templates cannot express most of Jinja): it
is rendered on a conversation of sentinel contents, and the text between the contents becomes the Go template's
literal pieces: P before the first user message (Ps before a system message and Z after it), X after each user
message (its end and the assistant header: the generation prompt), Y after each assistant message. A template whose
pieces depend on the contents (or that rejects the conversation) gets no TEMPLATE: Ollama then detects one from the
file's tokenizer.chat_template, and the Modelfile says so in a comment. `check_modelfile` parses the file back and
renders two other conversations with it, which must equal the Jinja template's text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtune.files import write_atomic

SENTINEL = "\x00{}\x00"
_PIECES = ("P", "Ps", "Z", "X", "Y")


@dataclass(frozen=True, kw_only=True)
class Pieces:
    """The literal text around each message, as the trained template renders it (module docstring)."""

    P: str
    X: str
    Y: str
    Ps: str | None = None
    Z: str | None = None

    def render(self, messages: list[dict[str, str]]) -> str:
        """What the Go template renders for `messages` followed by the generation prompt."""
        out = []
        for i, message in enumerate(messages):
            role, content = message["role"], message["content"]
            if role == "system" and self.Ps is not None:
                out.append(f"{self.Ps}{content}{self.Z}")
            elif role == "user":
                out.append(f"{self.P if i == 0 else ''}{content}{self.X}")
            elif role == "assistant":
                out.append(f"{content}{self.Y}")
        return "".join(out)

    def go_template(self) -> str:
        """Ollama's TEMPLATE: the same text as `render`, in Go template syntax (literals quoted with printf %s)."""

        def text(value: str | None) -> str:
            return '{{ printf "%s" ' + json.dumps(value or "", ensure_ascii=False) + " }}"

        system = f'{{{{ if eq $m.Role "system" }}}}{text(self.Ps)}{{{{ $m.Content }}}}{text(self.Z)}{{{{ else }}}}'
        return (
            "{{- range $i, $m := .Messages }}"
            + (system if self.Ps is not None else "")
            + f'{{{{ if eq $m.Role "user" }}}}{{{{ if eq $i 0 }}}}{text(self.P)}{{{{ end }}}}{{{{ $m.Content }}}}'
            + f'{text(self.X)}{{{{ else if eq $m.Role "assistant" }}}}{{{{ $m.Content }}}}{text(self.Y)}{{{{ end }}}}'
            + ("{{ end }}" if self.Ps is not None else "")
            + "{{ end }}"
        )


def template_pieces(tokenizer: Any, *, strip_bos: bool) -> Pieces | None:
    """The trained template's Pieces, or None when its text around a message depends on the contents."""
    if not tokenizer.chat_template:
        return None
    s, u1, a1, u2 = (SENTINEL.format(name) for name in ("S", "U1", "A1", "U2"))
    plain = _render(tokenizer, [("user", u1), ("assistant", a1), ("user", u2)])
    if plain is None or not _ordered(plain, [u1, a1, u2]):
        return None
    prefix, rest = plain.split(u1)
    x, rest = rest.split(a1)
    y, x_end = rest.split(u2)
    if x != x_end:
        return None
    if strip_bos and tokenizer.bos_token and prefix.startswith(tokenizer.bos_token):
        prefix = prefix[len(tokenizer.bos_token) :]  # llama.cpp adds it (the file's add_bos_token)
    pieces = Pieces(P=prefix, X=x, Y=y)
    if _template_problems(pieces, tokenizer, strip_bos, "", CONVERSATIONS):
        return None
    system = _render(tokenizer, [("system", s), ("user", u1), ("assistant", a1), ("user", u2)])
    if system is not None and _ordered(system, [s, u1, a1, u2]):
        system_prefix, rest = system.split(s)
        z = rest.split(u1)[0]
        if strip_bos and tokenizer.bos_token and system_prefix.startswith(tokenizer.bos_token):
            system_prefix = system_prefix[len(tokenizer.bos_token) :]
        with_system = Pieces(P=prefix, X=x, Y=y, Ps=system_prefix, Z=z)
        # A template that puts the system text elsewhere (Mistral's: into the last user turn) keeps no system piece.
        if not _template_problems(with_system, tokenizer, strip_bos, "", SYSTEM_CONVERSATIONS):
            return with_system
    return pieces


def _render(tokenizer: Any, turns: list[tuple[str, str]]) -> str | None:
    try:
        return tokenizer.apply_chat_template(
            [{"role": r, "content": c} for r, c in turns], tokenize=False, add_generation_prompt=True
        )
    except Exception:  # noqa: BLE001  # a template that refuses a role or an order has no pieces for it
        return None


def _ordered(text: str, sentinels: list[str]) -> bool:
    positions = [text.find(s) for s in sentinels]
    return all(text.count(s) == 1 for s in sentinels) and positions == sorted(positions)


def stop_strings(tokenizer: Any, stop_ids: tuple[int, ...]) -> list[str]:
    return [tokenizer.convert_ids_to_tokens(token) for token in stop_ids]


def modelfile_path(gguf_file: Path) -> Path:
    return gguf_file.with_suffix(".Modelfile")


def modelfile_text(gguf_file: Path, pieces: Pieces | None, stops: list[str], base: Path | None = None) -> str:
    """`base`: for an adapter file, the base it applies to (FROM the base, ADAPTER the file)."""
    lines = [f"# Ollama: ollama create NAME -f {gguf_file.with_suffix('.Modelfile').name}"]
    lines += [f"FROM ./{base.name}", f"ADAPTER ./{gguf_file.name}"] if base else [f"FROM ./{gguf_file.name}"]
    if pieces is None:
        lines.append(
            "# No TEMPLATE: the trained chat template's text depends on the contents; Ollama reads the file's."
        )
    else:
        lines.append(f'TEMPLATE """{pieces.go_template()}"""')
    lines += [f"PARAMETER stop {json.dumps(stop, ensure_ascii=False)}" for stop in stops]
    return "\n".join(lines) + "\n"


def write_modelfile(gguf_file: Path, *, key: str, base: Path | None = None) -> Path:
    """gguf/<run>-<type>.Modelfile beside `gguf_file`, from its run's tokenizer and trained terminators (`base`:
    an adapter file's base file)."""
    tokenizer, stop_ids, strip_bos = _run_facts(gguf_file.parent.parent)
    pieces = template_pieces(tokenizer, strip_bos=strip_bos)
    target = modelfile_path(gguf_file)
    text = modelfile_text(gguf_file, pieces, stop_strings(tokenizer, stop_ids), base)
    write_atomic(target, text.encode(), key=key)
    return target


def _run_facts(run_dir: Path) -> tuple[Any, tuple[int, ...], bool]:
    from transformers import AutoTokenizer

    from seqtune.export.facts import ship_facts

    source = next(run_dir / name for name in ("merged", "model", "adapter") if (run_dir / name).is_dir())
    tokenizer = AutoTokenizer.from_pretrained(source)
    strip_bos = tokenizer.bos_token_id is not None and tokenizer("a")["input_ids"][:1] == [tokenizer.bos_token_id]
    return tokenizer, ship_facts(tokenizer, run_dir).stop.eos, strip_bos


_LITERAL = re.compile(r'\{\{ printf "%s" ("(?:[^"\\]|\\.)*") \}\}')


def parse_modelfile(text: str) -> dict[str, Any]:
    """FROM, TEMPLATE (its Pieces, read back from the literals) and the stop parameters of a Modelfile seqtune
    wrote."""
    found: dict[str, Any] = {"from": None, "adapter": None, "pieces": None, "stops": []}
    template = re.search(r'^TEMPLATE """(.*?)"""$', text, flags=re.M | re.S)
    if template:
        literals = [json.loads(m) for m in _LITERAL.findall(template.group(1))]
        names = ("Ps", "Z", "P", "X", "Y") if len(literals) == 5 else ("P", "X", "Y")
        found["pieces"] = Pieces(**dict(zip(names, literals, strict=True)))
    for line in text.splitlines():
        if line.startswith("FROM "):
            found["from"] = line.removeprefix("FROM ").strip()
        elif line.startswith("ADAPTER "):
            found["adapter"] = line.removeprefix("ADAPTER ").strip()
        elif line.startswith("PARAMETER stop "):
            found["stops"].append(json.loads(line.removeprefix("PARAMETER stop ")))
    return found


def check_modelfile(gguf_file: Path, base: Path | None = None) -> list[str]:
    """Problems with the Modelfile beside `gguf_file`, parsed back: it names the file (an adapter's: its base, then
    the file as ADAPTER), stops at every trained terminator and its template renders two conversations as the
    trained template does."""
    path = modelfile_path(gguf_file)
    if not path.is_file():
        return [f"{path.name} is missing"]
    parsed = parse_modelfile(path.read_text())
    tokenizer, stop_ids, strip_bos = _run_facts(gguf_file.parent.parent)
    problems = []
    wanted = (f"./{base.name}", f"./{gguf_file.name}") if base else (f"./{gguf_file.name}", None)
    if (parsed["from"], parsed["adapter"]) != wanted:
        problems.append(f"{path.name} says FROM {parsed['from']} ADAPTER {parsed['adapter']}, not {wanted}")
    if parsed["stops"] != stop_strings(tokenizer, stop_ids):
        problems.append(f"{path.name} stops at {parsed['stops']}, the trained terminators are {stop_ids}")
    expected = template_pieces(tokenizer, strip_bos=strip_bos)
    if (parsed["pieces"] is None) != (expected is None):
        problems.append(f"{path.name} {'lacks' if expected else 'has'} a TEMPLATE")
    elif parsed["pieces"] is not None:
        pieces = parsed["pieces"]
        conversations = CONVERSATIONS + (SYSTEM_CONVERSATIONS if pieces.Ps is not None else [])
        problems += _template_problems(pieces, tokenizer, strip_bos, path.name, conversations)
    return problems


CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 plus 2?"}],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Name a colour."},
    ],
]
SYSTEM_CONVERSATIONS = [[{"role": "system", "content": "Be brief."}, *conversation] for conversation in CONVERSATIONS]


def _template_problems(
    pieces: Pieces, tokenizer: Any, strip_bos: bool, name: str, conversations: list[list[dict[str, str]]]
) -> list[str]:
    """The conversations `pieces` renders unlike the trained template."""
    problems = []
    for messages in conversations:
        trained = _render(tokenizer, [(m["role"], m["content"]) for m in messages])
        if trained is None:
            problems.append(f"the trained template refuses a {len(messages)}-message conversation")
            continue
        if strip_bos and tokenizer.bos_token:
            trained = trained.removeprefix(tokenizer.bos_token)
        if pieces.render(messages) != trained:
            problems.append(f"{name}'s TEMPLATE renders a {len(messages)}-message conversation unlike the trained one")
    return problems
