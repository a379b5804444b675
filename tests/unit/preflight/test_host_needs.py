"""Preflight's check of the host memory a plan needs while loading model.path and for its data workers: refused
over the host's memory, naming the lever (seqtune.preflight.host)."""

from __future__ import annotations

from seqtune.preflight.host import HostNeeds, check_host_needs


def needs(*, loading: float = 0.0, workers: int = 0, per_worker: float = 0.25, ranks: int = 1) -> HostNeeds:
    return HostNeeds(loading_gib=loading, workers=workers, per_worker_gib=per_worker, ranks=ranks)


def test_nothing_is_checked_without_a_host_budget_or_within_it():
    assert check_host_needs(needs(loading=100.0, workers=8), offloaded_gib=0.0, host_memory_gib=None) == []
    assert check_host_needs(needs(loading=10.0, workers=8), offloaded_gib=4.0, host_memory_gib=16.0) == []


def test_loading_over_the_host_names_the_ranks_that_fit_and_qlora():
    (problem,) = check_host_needs(needs(loading=64.0, ranks=4), offloaded_gib=0.0, host_memory_gib=40.0)
    assert problem.key == "model.path"
    assert "loading model.path takes ~64.0 GiB of host memory (4 rank(s)" in problem.message
    assert "Fix: launcher.nproc_per_node=2 (each rank loads it whole)" in problem.message
    assert "model.load_in_4bit=true" in problem.message


def test_one_rank_that_cannot_load_is_not_offered_fewer_ranks():
    (problem,) = check_host_needs(needs(loading=64.0), offloaded_gib=0.0, host_memory_gib=40.0)
    assert "nproc_per_node" not in problem.message and "model.load_in_4bit=true" in problem.message


def test_workers_beside_what_is_offloaded_name_the_most_workers_that_fit():
    (problem,) = check_host_needs(needs(workers=8, per_worker=0.5, ranks=2), offloaded_gib=10.0, host_memory_gib=13.0)
    assert problem.key == "data.num_workers"
    assert "~8.0 GiB of host memory" in problem.message and "on top of 10.0 GiB offloaded" in problem.message
    assert "Fix: data.num_workers=3 " in problem.message  # 3 GiB left: 3 workers x 2 ranks x 0.5 GiB


def test_offload_alone_over_the_host_is_left_to_the_offload_check():
    """checks.check_host_memory reports it, with the offload levers: no second problem for the workers."""
    assert check_host_needs(needs(workers=2), offloaded_gib=20.0, host_memory_gib=16.0) == []


def test_preflight_refuses_workers_and_a_checkpoint_the_host_cannot_hold_and_the_lever_passes(tmp_path):
    """Through run_preflight: data.num_workers=2 over preflight.host_memory_gib=0.3 names data.num_workers=1,
    which passes; a model.path checkpoint over a tiny host budget is refused at model.path."""
    from tests.support.checkpoints import build_checkpoint
    from tests.support.configs import TINY_MODEL, alpaca, make_cfg, messages, run_failing
    from tests.support.data import write_jsonl

    TINY_FIELDS = [key for key in TINY_MODEL if key != "family"]

    from seqtune.preflight import run_preflight

    train = write_jsonl(tmp_path / "train.jsonl", [alpaca(n, i) for i, n in enumerate([1, 3, 7, 20])])
    budget = "preflight.host_memory_gib=0.3"
    report = run_failing(
        make_cfg(tmp_path, train, "data.num_workers=2", budget), tmp_path / "two", match=r"\[memory\] data.num_workers"
    )
    assert "Fix: data.num_workers=1 " in messages(report)
    fits = run_preflight(make_cfg(tmp_path, train, "data.num_workers=1", budget), tmp_path / "one").memory
    assert 0.25 <= fits.host_workers_gib < 0.3 and fits.host_memory_gib == 0.3
    checkpoint = build_checkpoint("smollm", tmp_path / "smollm")
    # model.path's own config.json states the architecture: the tiny fields make_cfg sets are cleared
    by_path = (f"model.path={checkpoint}", "model.family=auto", "tokenizer.source=path")
    by_path += tuple(f"model.{key}=null" for key in TINY_FIELDS)
    loading = run_preflight(make_cfg(tmp_path, train, *by_path), tmp_path / "l")
    assert loading.memory.host_loading_gib > 0
    tight = f"preflight.host_memory_gib={loading.memory.host_loading_gib / 2}"
    report = run_failing(
        make_cfg(tmp_path, train, *by_path, tight),
        tmp_path / "tight",
        match=r"\[memory\] model.path",
    )
    assert "loading model.path takes" in messages(report)
