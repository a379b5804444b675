"""What people run locally, from one tiny LoRA run (the bundled TinyLlama tokenizer, hidden size 256 so llama.cpp's
k-quant blocks of 256 fit every matrix row): a q4_k_m GGUF file quantized by llama.cpp from the f16 file and proven
by running it in llama.cpp, the LoRA as a llama.cpp adapter file on its base's file, the Ollama Modelfile beside
each file, the post-hoc `python -m seqtune.export RUN_DIR --gguf q6_k`, and the run served to an OpenAI client
(`python -m seqtune.serve`) and chatted with (`python -m seqtune.chat`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import REPO, run_cli
from tests.support.data import write_sums_chat

pytestmark = pytest.mark.slow

END, EOS = 7, 1  # the bundled tokenizer's <|end|> (the chat template's turn end) and </s>


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("local")
    data = write_sums_chat(root / "chat.jsonl")
    result = run_cli(
        [
            "model=tinyllama_tiny",
            "model.hidden_size=256",
            "model.intermediate_size=512",
            f"data.train={data}",
            "data.format=chat",
            "data.val_fraction=0.25",
            "train.max_steps=2",
            "train.export_merged=true",
            "train.export_gguf=[f16,q4_k_m]",
            "train.export_gguf_adapter=true",
            "preflight.plot=false",
            "preflight.show=0",
        ],
        root / "run",
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return root / "run"


def proof_of(run_dir: Path, artifact: str) -> dict:
    proofs = json.loads((run_dir / "export.json").read_text())["artifacts"]
    return next(p for p in proofs if p["artifact"] == artifact)


def test_q4_k_m_runs_in_llama_cpp_within_its_bound(run_dir):
    proof = proof_of(run_dir, "gguf/run-q4_k_m.gguf")
    checks = proof["checks"]
    assert proof["ok"], proof
    assert checks["engine"] == "llama-cpp-py-sync 0.11739 (llama.cpp b11739)"
    assert checks["compared_with"] == "gguf/run-f16.gguf"
    assert 0 < checks["max_logit_difference_relative"] <= checks["bound"] == 0.12
    assert checks["positions"] == 12 and checks["top1_agreement"] > 0.5
    # the bundled tokenizer's GPT-2 split: llama.cpp read " 3" as two pieces before its pre-tokenizer was named
    assert checks["prompt_ids_equal"] == [True] * 5  # the 3 validation prompts, the 2 probe conversations
    assert checks["stops"] == {str(EOS): True, str(END): True}
    assert checks["tensor_types"]["Q4_K"] > 0, checks["tensor_types"]
    assert checks["greedy"][-1] in (EOS, END) or len(checks["greedy"]) == 16


def test_the_adapter_gguf_on_its_base_gives_the_merged_files_logits_in_llama_cpp(run_dir):
    import gguf

    proof = proof_of(run_dir, "gguf/run-lora.gguf")
    checks = proof["checks"]
    assert proof["ok"], proof
    assert (checks["base"], checks["compared_with"]) == ("run-base.gguf", "run-f16.gguf")
    assert checks["max_logit_difference_relative"] <= checks["bound"] == 5e-3
    # the adapter is what brings the base to the merged model (here mostly the lm_head trained in full)
    assert checks["max_logit_difference_relative_without_adapter"] > 5 * checks["max_logit_difference_relative"]
    assert proof_of(run_dir, "gguf/run-base.gguf")["ok"]
    reader = gguf.GGUFReader(run_dir / "gguf" / "run-lora.gguf")
    field = lambda key: reader.get_field(key).contents()  # noqa: E731
    assert (field("general.type"), field("adapter.type"), field("adapter.lora.alpha")) == ("adapter", "lora", 32.0)
    names = sorted(t.name for t in reader.tensors)
    assert all(n.endswith((".lora_a", ".lora_b")) for n in names) and "output.weight.lora_b" in names
    assert len(names) == 2 * (2 * 7 + 1)  # 2 layers x 7 projections, and the head


def test_a_modelfile_beside_each_gguf_parses_back(run_dir):
    from transformers import AutoTokenizer

    from seqtune.export.modelfile import parse_modelfile

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "merged")
    for gguf_type in ("f16", "q4_k_m"):
        parsed = parse_modelfile((run_dir / "gguf" / f"run-{gguf_type}.Modelfile").read_text())
        assert parsed["from"] == f"./run-{gguf_type}.gguf"
        assert parsed["stops"] == ["</s>", "<|end|>"]
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "What is 1 plus 1?"},
        ]
        trained = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert parsed["pieces"].render(messages) == trained.removeprefix("<s>")  # llama.cpp adds bos itself
        assert proof_of(run_dir, f"gguf/run-{gguf_type}.gguf")["checks"]["modelfile"] is True
    adapter = parse_modelfile((run_dir / "gguf" / "run-lora.Modelfile").read_text())
    assert (adapter["from"], adapter["adapter"]) == ("./run-base.gguf", "./run-lora.gguf")


def test_export_cli_quantizes_another_type_and_proves_it(run_dir):
    result = subprocess.run(
        [sys.executable, "-m", "seqtune.export", str(run_dir), "--gguf", "q6_k"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "export proof: gguf/run-q6_k.gguf: ok: runs in llama.cpp" in result.stdout
    checks = proof_of(run_dir, "gguf/run-q6_k.gguf")["checks"]
    assert checks["max_logit_difference_relative"] <= checks["bound"] == 0.04
    assert checks["tensor_types"]["Q6_K"] > 0


@pytest.fixture(scope="module")
def server(run_dir):
    """`python -m seqtune.serve RUN_DIR --port 0` (a free port), its address read from its first line."""
    process = subprocess.Popen(
        [sys.executable, "-m", "seqtune.serve", str(run_dir), "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert "serving" in line, line + process.stderr.read()
    yield line.split(" on ")[-1].strip()
    process.terminate()
    assert process.wait(timeout=60) == 0


def proof_greedy(run_dir: Path) -> tuple[list[int], list[int]]:
    """The export proof's greedy tokens for merged/ and the ids they continue (a validation prompt and its first
    reference tokens)."""
    checks = proof_of(run_dir, "merged")["checks"]
    return checks["greedy_prompt"], checks["greedy"]


def answer_text(run_dir: Path, tokens: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(run_dir / "merged").decode(tokens[:-1] if tokens[-1] in (EOS, END) else tokens)


def transformers_greedy(run_dir: Path, messages: list[dict], new_tokens: int) -> list[int]:
    """merged/'s own greedy answer to `messages`, with transformers (its generation_config.json stops it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "merged")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    model = AutoModelForCausalLM.from_pretrained(run_dir / "merged")
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens)
    return out[0, ids.shape[1] :].tolist()


MESSAGES = [{"role": "user", "content": "What is 5 plus 5?"}]


def test_serve_answers_an_openai_client_with_the_proofs_greedy_tokens(run_dir, server):
    import openai
    from transformers import AutoTokenizer

    prompt, greedy = proof_greedy(run_dir)
    client = openai.OpenAI(base_url=server, api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["run"]
    completion = client.completions.create(model="run", prompt=prompt, temperature=0, max_tokens=len(greedy))
    assert completion.choices[0].text == answer_text(run_dir, greedy)
    assert completion.usage.completion_tokens == len(greedy)
    assert completion.choices[0].finish_reason == ("stop" if greedy[-1] in (EOS, END) else "length")
    chat = client.chat.completions.create(model="run", messages=MESSAGES, temperature=0, max_tokens=16)
    answer = chat.choices[0].message.content
    assert answer == answer_text(run_dir, transformers_greedy(run_dir, MESSAGES, 16))
    rendered = AutoTokenizer.from_pretrained(run_dir / "merged").apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    assert (
        client.completions.create(model="run", prompt=rendered, temperature=0, max_tokens=16).choices[0].text == answer
    )
    streamed = client.chat.completions.create(model="run", messages=MESSAGES, temperature=0, max_tokens=16, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == answer


def test_serve_answers_bad_requests_with_openai_errors(server):
    import urllib.error
    import urllib.request

    import openai

    client = openai.OpenAI(base_url=server, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="run", messages=[{"role": "robot", "content": "hi"}])
    assert bad.value.status_code == 400 and bad.value.body["param"] == "messages[0].role"
    with pytest.raises(openai.BadRequestError, match="'temperature' must be a number in"):
        client.chat.completions.create(model="run", messages=[{"role": "user", "content": "hi"}], temperature=7)
    with pytest.raises(openai.BadRequestError, match="'stop' is not supported"):
        client.chat.completions.create(model="run", messages=[{"role": "user", "content": "hi"}], stop=["."])
    with pytest.raises(openai.NotFoundError, match="model_not_found|not served here"):
        client.completions.create(model="gpt-4o", prompt="hi")
    request = urllib.request.Request(f"{server}/chat/completions", data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(request, timeout=60)
    body = json.loads(raw.value.read())
    assert raw.value.code == 400 and body["error"]["type"] == "invalid_request_error"
    assert "the body is not JSON" in body["error"]["message"]


def test_chat_answers_piped_messages_with_the_runs_template(run_dir):
    expected = answer_text(run_dir, transformers_greedy(run_dir, MESSAGES, 16))
    message = MESSAGES[0]["content"]
    result = subprocess.run(
        [sys.executable, "-m", "seqtune.chat", str(run_dir), "--max-tokens", "16", "--temperature", "0"],
        cwd=REPO,
        input=f"{message}\n/reset\n{message}\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [f"assistant> {expected}"] * 2, result.stdout


def test_chat_in_a_terminal_shows_the_answer_in_rich_s_console(run_dir, monkeypatch):
    """A terminal gets rich's console (seqtune.chat.RichScreen): the header names the served export and its stop
    tokens, the answer is transformers' greedy answer, and a line after it says how it ended."""
    import io
    from dataclasses import replace

    from rich.console import Console

    from seqtune.chat import RichScreen, converse
    from seqtune.export.engine import Engine

    engine = Engine(run_dir, device="cpu")
    settings = replace(engine.defaults, max_tokens=16, temperature=0.0)
    console = Console(file=io.StringIO(), record=True, force_terminal=True, width=200)
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{MESSAGES[0]['content']}\n/exit\n"))
    converse(engine, settings, system=None, screen=RichScreen(engine, settings, console))
    shown = console.export_text()
    greedy = transformers_greedy(run_dir, MESSAGES, 16)
    assert f"{run_dir}/merged" in shown and "ends at </s>, <|end|>" in shown
    assert f"assistant> {answer_text(run_dir, greedy)}\n" in shown, shown
    ending = "ended at <|end|>" if greedy[-1] == END else "ended at </s>" if greedy[-1] == EOS else "token limit"
    assert f"{len(greedy)} tokens," in shown and ending in shown, shown


@pytest.fixture(scope="module")
def gguf_server(run_dir):
    """`python -m seqtune.serve RUN_DIR --gguf q4_k_m --port 0`: the k-quant file through llama.cpp."""
    process = subprocess.Popen(
        [sys.executable, "-m", "seqtune.serve", str(run_dir), "--gguf", "q4_k_m", "--port", "0"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert "serving" in line and "gguf/run-q4_k_m.gguf" in line, line + process.stderr.read()
    yield line.split(" on ")[-1].strip()
    process.terminate()
    assert process.wait(timeout=60) == 0


def test_serve_gguf_answers_with_the_gguf_proofs_greedy_tokens(run_dir, gguf_server):
    import openai
    from transformers import AutoTokenizer

    checks = proof_of(run_dir, "gguf/run-q4_k_m.gguf")["checks"]
    prompt, greedy = checks["greedy_prompt"], checks["greedy"]
    client = openai.OpenAI(base_url=gguf_server, api_key="unused", max_retries=0)
    completion = client.completions.create(model="run", prompt=prompt, temperature=0, max_tokens=len(greedy))
    assert completion.choices[0].text == answer_text(run_dir, greedy)
    assert completion.usage.completion_tokens == len(greedy)
    chat = client.chat.completions.create(model="run", messages=MESSAGES, temperature=0, max_tokens=16)
    rendered = AutoTokenizer.from_pretrained(run_dir / "merged").apply_chat_template(
        MESSAGES, tokenize=False, add_generation_prompt=True
    )
    same = client.completions.create(model="run", prompt=rendered, temperature=0, max_tokens=16)
    assert chat.choices[0].message.content == same.choices[0].text


def test_serve_gguf_refuses_a_file_the_run_does_not_have(run_dir):
    result = subprocess.run(
        [sys.executable, "-m", "seqtune.serve", str(run_dir), "--gguf", "q5_k_m", "--port", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "run-q5_k_m.gguf does not exist" in result.stderr and "python -m seqtune.export" in result.stderr
