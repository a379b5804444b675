"""Writes the agent demo's data (seqtune/data/assets/agent/): vault prompts for GRPO with rollout.environment=Vault
(seqtune/rollout/agent_examples.py), and chat records that first teach a tiny model the tool-call format by SFT:
half of them open the vault (a call, its result, the secret as the answer), half answer a guess without a call, so
the SFT model calls the tool about half the time and GRPO has something to learn (docs/agents.md).
Run: python scripts/make_agent_data.py"""

from __future__ import annotations

import json
import random
from pathlib import Path

from transformers.utils.chat_template_utils import get_json_schema

from seqtune.rollout.agent_examples import Vault
from seqtune.rollout.render import with_observation

OUT = Path(__file__).resolve().parents[1] / "seqtune/data/assets/agent"
QUESTIONS = ("What is in vault {i}?", "Tell me the secret of vault {i}.", "Vault {i}: what number is inside?")


def prompt(rng: random.Random, vaults: range = range(100)) -> tuple[list[dict], str]:
    i = rng.choice(vaults)
    return [{"role": "user", "content": rng.choice(QUESTIONS).format(i=i)}], str(rng.randrange(10, 100))


def sft_record(rng: random.Random, calls: bool) -> dict:
    messages, secret = prompt(rng)
    messages = with_observation(messages, "The vault is closed.")  # what reset() appends in the GRPO run
    if calls:
        call = {"type": "function", "function": {"name": "open_vault", "arguments": {}}}
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": secret},
            {"role": "assistant", "content": secret},
        ]
    else:
        messages.append({"role": "assistant", "content": str(rng.randrange(10, 100))})
    return {"messages": messages, "tools": [get_json_schema(Vault().open_vault)]}


def main() -> None:
    rng = random.Random(0)
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "sft.jsonl").open("w") as out:
        for n in range(256):
            out.write(json.dumps(sft_record(rng, calls=n % 2 == 0)) + "\n")
    for split, count, vaults in (("train", 256, range(100)), ("val", 16, range(100, 200))):  # val's never trained
        with (OUT / f"{split}.jsonl").open("w") as out:
            for _ in range(count):
                messages, secret = prompt(rng, vaults)
                out.write(json.dumps({"prompt": messages, "secret": secret}) + "\n")


if __name__ == "__main__":
    main()
