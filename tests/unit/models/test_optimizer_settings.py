"""Each optimizer class declares the optim.* settings it reads (seqtune.models.optimizers.SETTINGS): the recipe builds
it with exactly those, and preflight refuses any other set away from its default, naming the key and a fix that
passes (optim.name=sgd with optim.betas used to train and never read them)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from seqtune.config.schema import OptimConfig, OptimName
from seqtune.models.optimizers import IMPLEMENTATIONS, SETTINGS, unread_settings
from seqtune.train.optim import build_optimizer

CPU_CLASSES = sorted({(name, cls) for (name, device), cls in IMPLEMENTATIONS.items() if device == "cpu"})
# A value away from the schema's default for every setting some optimizer reads.
CHANGED = {"lr": 0.123, "weight_decay": 0.05, "betas": [0.8, 0.95], "eps": 1e-6}


def test_every_setting_an_optimizer_may_read_is_listed_here():
    assert {key for keys in SETTINGS.values() for key in keys} == set(CHANGED)
    assert set(SETTINGS) == set(IMPLEMENTATIONS.values())


@pytest.mark.parametrize(("name", "implementation"), CPU_CLASSES)
def test_a_setting_is_honoured_by_the_class_that_reads_it_and_refused_for_one_that_does_not(name, implementation):
    cfg = OptimConfig(name=OptimName(name), **CHANGED)
    group = build_optimizer([torch.nn.Parameter(torch.zeros(4))], cfg, implementation).param_groups[0]
    reads = SETTINGS[implementation]
    for key in reads:
        assert group[key] == (tuple(CHANGED[key]) if key == "betas" else CHANGED[key]), key
    refused = unread_settings(implementation, cfg)
    assert [key for key, _ in refused] == sorted(f"optim.{key}" for key in set(CHANGED) - set(reads))
    for key, message in refused:
        fix = message.split("Fix: ")[1].split(" ")[0]  # optim.KEY=DEFAULT, as typed on the command line
        assert fix.startswith(f"{key}=") and "never reads it: it is built with optim.lr" in message
        plain = key.removeprefix("optim.")
        fixed = dataclasses.replace(cfg, **{plain: getattr(OptimConfig(), plain)})
        assert key not in [k for k, _ in unread_settings(implementation, fixed)]


def test_sgd_refuses_betas_and_eps_only_when_they_are_set():
    assert unread_settings(IMPLEMENTATIONS[("sgd", "cpu")], OptimConfig(name=OptimName.sgd)) == []
    [(key, message)] = unread_settings(IMPLEMENTATIONS[("sgd", "cpu")], OptimConfig(name=OptimName.sgd, eps=1e-6))
    assert key == "optim.eps"
    assert message == (
        "optim.eps=1e-06 is set, but optim.name=sgd (torch.optim.SGD) never reads it: it is built with optim.lr, "
        "optim.weight_decay only. Fix: optim.eps=1e-08 (its default), or an optimizer that reads it (optim.name=adamw)"
    )
