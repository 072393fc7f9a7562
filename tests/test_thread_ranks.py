"""Thread ranks as safe as processes: every experiment that offers `launch(..., threads=True)`
gives, run after run, what its process ranks give; a model built from a seed is the same in
every thread, whatever the other threads build or draw at the same moment (torch has one global
random generator per process, which thread ranks share)."""
import threading

import pytest
import torch
from thread_ranks import run_threads

import helpers
from helpers import launch, pipeline_run, pipelining_run, run_ranks
from helpers.composed.model import gpt

ROUNDS = 30      # a race seen in 7 runs of 30 escapes 30 rounds of 4 threads with p < 1e-9


def _state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


BUILDS = {
    "small_block": lambda: helpers.small_block(width=32, heads=4, seed=3),
    "small_stack": lambda: helpers.small_stack(blocks=2, width=16, heads=2, seed=4),
    "make_model": lambda: helpers.make_model("mlp", seed=5),
    "make_model lm": lambda: helpers.make_model("lm", seed=6),
    "pipeline_net": lambda: helpers.pipeline_net(vocab=512, width=64, depth=4, seed=7),
    "tiny_tp_lm": lambda: helpers.tiny_tp_lm(seed=8),
    "gpt": lambda: gpt(seed=9),
    "MoE": lambda: helpers.MoE(seed=10),
}


def test_seeded_builds_are_the_same_in_every_thread_rank():
    """Four thread ranks build every seeded model of the course at the same moment, with a
    tensor-parallel block (built from the small block) beside them, round after round: each
    build equals the one made alone in the caller, and the caller's random numbers are left
    as they were."""
    want = {name: _state(build()) for name, build in BUILDS.items()}
    torch.manual_seed(123)
    before = torch.get_rng_state()
    world = 4
    start = threading.Barrier(world)
    bad = []

    def rank_fn(comm):
        for _ in range(ROUNDS):
            start.wait()
            for name, build in BUILDS.items():
                got = build()
                if not _same(_state(got), want[name]):
                    bad.append(name)
                if name == "small_block":
                    helpers.TPBlock(got, comm)      # slices it: draws nothing either
        return True

    run_threads(rank_fn, world, timeout=60)
    assert not bad, f"thread ranks built other weights than the seed gives: {sorted(set(bad))}"
    assert torch.equal(torch.get_rng_state(), before), "a seeded build moved the caller's RNG"


NET = dict(vocab=256, width=32, depth=6)
SMALL = dict(net=NET, batch_size=12, seed=0, cuts=[2, 5])
RUNS = [("gpipe", pipeline_run, dict(SMALL, schedule="gpipe", m=4)),
        ("1f1b", pipeline_run, dict(SMALL, schedule="1f1b", m=4)),
        ("zb", pipeline_run, dict(SMALL, schedule="zb", m=2))]


def test_pipeline_runs_on_thread_ranks_equal_their_process_ranks():
    """pipeline_run offers thread ranks: run after run they give the losses and gradients
    its process ranks give (each thread builds the seeded net at the same moment)."""
    want = run_ranks(3, RUNS, timeout=120)
    for attempt in range(8):
        got = run_ranks(3, RUNS, threads=True, timeout=60)
        for rank, (g, w) in enumerate(zip(got, want)):
            for label in w:
                run_g, run_w = g[label], w[label]
                what = f"run {attempt}, rank {rank}, {label}"
                if run_w.loss is not None:
                    assert run_g.loss == pytest.approx(run_w.loss, rel=1e-6), what
                for a, b in zip(run_g.grads[rank], run_w.grads[rank]):
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=what)


def test_torch_schedules_refuse_thread_ranks():
    """torch's pipelining schedules need a process group: on thread ranks a clear refusal
    before any work of the run, not an error from deep inside torch."""
    cfg = dict(net=NET, batch_size=8, seed=0, schedule="Schedule1F1B", m=2, cuts=[3])
    with pytest.raises(helpers.RankFailed, match="process ranks"):
        launch(pipelining_run, 2, cfg, threads=True, timeout=20)


def test_a_misspelt_cfg_key_fails_before_any_work_naming_the_key_meant():
    """take guards every launch target's cfg: `sede` for `seed` would otherwise run seed 0
    silently; the rank fails at once, naming the key it did not expect and the one meant."""
    cfg = dict(net=NET, batch_size=8, sede=3, schedule="1f1b", m=2, cuts=[3])
    with pytest.raises(helpers.RankFailed, match=r"unexpected \['sede'\] \(a typo\? 'sede' -> "
                                                 r"'seed'\)"):
        launch(pipeline_run, 2, cfg, threads=True, timeout=20)


def test_a_thread_ranks_cfg_holds_what_a_process_ranks_does():
    """Launch targets read cfg with take, which allows only their own keys and the
    launcher's (device, comm): thread ranks add nothing else."""
    got = launch(_cfg_keys, 2, dict(a=1), threads=True, timeout=20)
    assert got == [["a", "comm", "device"]] * 2, got


def _cfg_keys(rank, world, cfg):
    return sorted(cfg)


def test_each_run_in_turn_counts_only_its_own_traffic():
    """run_ranks on thread ranks: the barrier between two runs is not counted into the next
    run's traffic (one shared ThreadComm per rank), so a run need not reset the counts itself."""
    def talk(rank, world, cfg):
        cfg["comm"].all_reduce(torch.ones(4))
        return len(cfg["comm"].traffic)

    def quiet(rank, world, cfg):
        return len(cfg["comm"].traffic)
    out = run_ranks(2, [("talk", talk, {}), ("quiet", quiet, {})], threads=True)
    assert [r["talk"] for r in out] == [1, 1] and [r["quiet"] for r in out] == [0, 0]
