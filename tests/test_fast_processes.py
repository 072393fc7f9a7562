"""Part IV across processes: the allreduce cost model (fitted, and measured on gloo) and real
worker processes (gloo, one thread each) that train as the plain Part II path does."""
import pytest
import torch
from test_fast import fake_data, max_diff

import helpers
from helpers import (
    FastDataParallel,
    ResidentLoader,
    allreduce_time,
    bucketed_allreduce,
    fit_alpha_beta,
    flatten,
    get_params,
    init_lenet_params,
    ring_allreduce,
    train_batch,
)
from helpers.data_parallel.speed_experiments import compare_with_dist_all_reduce

CPU = torch.device("cpu")


# --- cost model -------------------------------------------------------------------------------

def test_alpha_beta_fit_recovers_the_model():
    n = [1e3, 1e4, 1e5, 1e6, 1e7]
    t = [20e-6 + x / 5e9 for x in n]
    alpha, beta = fit_alpha_beta(n, t)
    assert abs(alpha - 20e-6) < 1e-9 and abs(beta / 5e9 - 1) < 1e-6


def test_allreduce_time_model():
    assert allreduce_time(1e6, 1, 1e-5, 1e9) == 0
    assert allreduce_time(8e6, 8, 0, 1e9) == pytest.approx(2 * 7 / 8 * 8e6 / 1e9)
    assert allreduce_time(8e6, 8, 1e-5, 1e9, "naive") > allreduce_time(8e6, 8, 1e-5, 1e9)
    with pytest.raises(ValueError):
        allreduce_time(1, 2, 0, 1, "tree")


def test_gloo_allreduce_across_two_processes():
    times = helpers.time_gloo_allreduce([16, 4096], world_size=2, reps=1)
    assert sorted(times) == [16, 4096] and all(t > 0 for t in times.values())
    every = helpers.time_gloo_allreduce([16], world_size=2, reps=3, keep="all")
    assert len(every[16]) == 3 and min(every[16]) > 0
    with pytest.raises(ValueError, match="'min'"):
        helpers.time_gloo_allreduce([16], keep="median")


def test_the_wait_split_takes_the_last_arrival_on_the_shared_clock():
    """Rank 0 arrives at 1.0 and 5.0, rank 1 at 1.5 and 4.0; the all-reduces end at 2.0 and 6.0:
    rank 0 waited 0.5 then 0, and 0.5 then 1.0 passed after the last arrival."""
    from helpers.data_parallel.speed_experiments import _waits
    wait, after = _waits([[[(1.0, 2.0), (5.0, 6.0)]], [[(1.5, 2.0), (4.0, 6.0)]]], 2)
    assert wait == [pytest.approx(0.25)] and after == [pytest.approx(0.75)]


# --- real worker processes (gloo, one thread each) ---------------------------------------------

def test_worker_processes_train_like_train_batch():
    """2 gloo workers on slices of the same global batches end where train_batch ends, with one
    flat message (fast) and with one message per tensor (reference)."""
    runs = [dict(name=m, global_batch=6, steps=2, reps=1, mode=m, return_params=True)
            for m in ("fast", "reference")]
    got = helpers.time_data_parallel([1, 2], runs, subset=64, seed=3)
    assert len(set(got.cores)) == min(2, len(__import__("os").sched_getaffinity(0))), \
        f"workers must be pinned to distinct cores, got {got.cores}"
    X, y = helpers.load_tensors(True, 64)
    devices = [CPU, CPU]
    ref = [get_params(init_lenet_params(seed=3), d) for d in devices]
    g = torch.Generator().manual_seed(3)
    for _ in range((runs[0]["reps"] + 1) * runs[0]["steps"]):   # warm-up repeat included
        idx = torch.randint(0, 64, (6,), generator=g)
        train_batch(X[idx], y[idx], ref, devices, 0.2)
    for k in (1, 2):
        for mode in ("fast", "reference"):
            res = got.times[k][mode]
            assert all(len(part) == 1 and part[0] >= 0
                       for part in (res.step_s, res.compute_s, res.comm_s, res.update_s,
                                    res.compute_cpu_s, res.wait_s, res.after_s))
            assert 0 < res.compute_cpu_s[0] <= res.compute_s[0] + 1e-3
            assert res.wait_s[0] + res.after_s[0] == pytest.approx(res.comm_s[0])
            if k == 2:
                assert res.comm_s[0] > 1e-6, "two workers must have communicated"
                assert res.after_s[0] > 0, "the all-reduce ends after the last arrival"
            else:
                assert res.wait_s[0] == 0.0, "one worker waits for nobody"
            params = [torch.tensor(p) for p in res.params]
            assert max_diff(ref[0], params) < 1e-5, (k, mode)
            assert max_diff(init_lenet_params(seed=3), params) > 1e-4, "training must move them"


def test_worker_runs_are_validated():
    with pytest.raises(TypeError, match=r"run 'x': cfg lacks \['global_batch'\]"):
        helpers.time_data_parallel(2, [dict(name="x", steps=1, reps=1)])
    with pytest.raises(ValueError, match="at least 1"):
        helpers.time_data_parallel(0, [])
    with pytest.raises(ValueError, match="split evenly"):
        helpers.time_data_parallel([1, 2], [dict(name="x", global_batch=3, steps=1, reps=1)])


def test_a_misspelt_run_key_is_refused_not_run_with_its_default():
    """A run's keys are read by `take`: `mdoe` would otherwise time the default mode."""
    run = dict(name="x", global_batch=2, steps=1, reps=1, mdoe="reference")
    with pytest.raises(TypeError, match="'mdoe' -> 'mode'"):
        helpers.time_data_parallel(1, [run], subset=64)


def test_ring_and_bucketed_allreduce_equal_torch_distributed():
    """The course's allreduces give what torch.distributed.all_reduce gives across 2 processes."""
    shapes = [(7, 3), (5,), (11, 2, 2), (13,)]
    inputs, sums = compare_with_dist_all_reduce(shapes, world_size=2, seed=5)
    assert not torch.equal(inputs[0][0], inputs[1][0]), "the ranks must hold different tensors"
    flats = [flatten(r) for r in inputs]
    ring_allreduce(flats)
    for f in flats:
        torch.testing.assert_close(f, flatten(sums), rtol=1e-6, atol=1e-6)
    grads = [[t.clone() for t in r] for r in inputs]
    bucketed_allreduce(grads, bucket_bytes=64)
    for r in grads:
        for a, b in zip(r, sums):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_compiled_fast_step_equals_train_batch_within_rounding(monkeypatch):
    """compile=True: forward and backward are one compiled function; the same arithmetic, up to
    float rounding (the compiler fuses and reorders). One shard size, so one compile."""
    # Inductor's vector ISA from the CPU's flags, without its trial builds of each ISA (a third
    # of the test's CPU): the same kernels as a reader's compile where the compiler builds that
    # ISA, and a kernel that fails to build falls back to eager, which `compiled` below refuses
    import torch._inductor.config as inductor
    monkeypatch.setattr(inductor.cpp, "vec_isa_ok", True)
    X, y = fake_data(128)
    devices = [CPU, CPU]
    p0 = init_lenet_params(seed=1)
    ref = [get_params(p0, d) for d in devices]
    net = FastDataParallel(p0, devices, 0.2, X, y, compile=True)
    loader = ResidentLoader(X, y, 64, seed=3)
    for _ in range(3):
        for idx in loader.index_batches():
            l_ref = train_batch(X[idx], y[idx], ref, devices, 0.2)
            torch.testing.assert_close(net.step(idx), l_ref, rtol=1e-5, atol=1e-5)
    assert net.compiled, "torch.compile fell back to eager on this machine"
    for c in range(2):
        assert max_diff(ref[c], net.params[c]) < 1e-5
    assert max_diff(ref[0], p0) > 1e-3, "training must have moved the parameters"
    assert net.flat_grads[0].abs().max() == 0, "gradients must be cleared after a step"


def test_fast_on_two_ranks_equals_train_batch():
    """The fast trainer across 2 gloo processes (one all_reduce of the flat gradients per step)
    ends where train_batch on 2 devices ends, fed the same global batches."""
    cfg = dict(batch_size=64, lr=0.2, num_epochs=2, subset=150, seed=4, return_params=True)
    got = helpers.launch(helpers.train_fast_rank, 2, cfg, quiet=True)
    assert got[0].param_sum == got[1].param_sum, "every rank holds the same parameters"
    got = got[0]
    X, y = helpers.load_tensors(True, 150)
    devices = [CPU, CPU]
    ref = [get_params(init_lenet_params(seed=4), d) for d in devices]
    loader = ResidentLoader(X, y, 64, seed=4)
    for _ in range(2):
        for idx in loader.index_batches():
            train_batch(X[idx], y[idx], ref, devices, 0.2)
    params = [torch.tensor(p) for p in got.params]
    assert max_diff(ref[0], params) < 1e-5
    assert max_diff(init_lenet_params(seed=4), params) > 1e-3, "training must move them"
    assert len(got.epoch_times) == 2 and 0 <= got.test_acc <= 1
