"""Tools, an environment and a reward shipped with seqtune for agent rollouts (rollout.tools, rollout.environment):
examples of what a user's own follow, and what the agent tests run. Plain Python, no torch.

A tool is a function with a type hint and a docstring line per argument (its JSON schema comes from them); an
environment is a class whose instance serves one rollout: reset(**columns) starts it from the record's columns and
returns the first observation (or None), its public methods are the tools, and reward functions read it through
`environments=`.
"""

from __future__ import annotations

from typing import Any


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


class Vault:
    """A vault holding the record's `secret`: only open_vault() tells it, and says_secret rewards an episode whose
    final answer states it."""

    def reset(self, secret: str, **columns: Any) -> str:
        self.secret = str(secret)
        self.opened = 0
        return "The vault is closed."

    def open_vault(self) -> str:
        """Open the vault and read the secret inside."""
        self.opened += 1
        return self.secret


def says_secret(completions: list[Any], environments: list[Any], **columns: Any) -> list[float]:
    """1.0 when the episode's final answer contains its vault's secret, 0.5 when it only opened the vault, else 0."""
    rewards = []
    for completion, vault in zip(completions, environments, strict=True):
        answer = str(completion[-1]["content"]) if completion else ""
        rewards.append(1.0 if vault.secret in answer else 0.5 if vault.opened else 0.0)
    return rewards
