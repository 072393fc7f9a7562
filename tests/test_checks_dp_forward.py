"""check_dp_forward of Part III's DataParallel chapter (helpers/checks/dataparallel.py): the
worked answer, shortcuts of different kinds (known cheats included: replicas cached across calls,
the replicas' outputs as a decoy), other right answers (threads, pools) (tests/check_cases.py);
threads beside the simulated GPUs end in a verdict, torch's CUDA-only steps are refused by name."""
import copy

import pytest
import torch
from check_cases import not_grading, other, parametrize_cases, quiet, shortcut, worked  # noqa: F401

import helpers


# ---- dp_forward --------------------------------------------------------------------------------
@worked("check_dp_forward")
def dp_forward(net, X, devices):
    replicas = [copy.deepcopy(net).to(d) for d in devices]        # replicate
    pieces = X.chunk(len(devices))                                 # scatter
    outs = [r(x.to(d)) for r, x, d in zip(replicas, pieces, devices)]
    return torch.cat([o.to(devices[0]) for o in outs])            # gather


@other("check_dp_forward", "a loop, the original as a template only")
def dp_forward_loop(net, X, devices):
    outs = []
    for d, x in zip(devices, torch.chunk(X, len(devices))):
        outs.append(copy.deepcopy(net).to(d)(x.to(d)).to(devices[0]))
    return torch.cat(outs, dim=0)


@other("check_dp_forward", "a thread per replica, as DataParallel's parallel_apply")
def dp_forward_threads(net, X, devices):
    import threading
    replicas = [copy.deepcopy(net).to(d) for d in devices]
    pieces, outs = X.chunk(len(devices)), [None] * len(devices)

    def forward(i):
        outs[i] = replicas[i](pieces[i].to(devices[i]))

    threads = [threading.Thread(target=forward, args=(i,)) for i in range(len(devices))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return torch.cat([o.to(devices[0]) for o in outs])


@other("check_dp_forward", "a thread pool's map over the replicas")
def dp_forward_pool(net, X, devices):
    from concurrent.futures import ThreadPoolExecutor
    replicas = [copy.deepcopy(net).to(d) for d in devices]
    pieces = [x.to(d) for x, d in zip(X.chunk(len(devices)), devices)]
    with ThreadPoolExecutor(len(devices)) as pool:
        outs = list(pool.map(lambda r, x: r(x), replicas, pieces))
    return torch.cat([o.to(devices[0]) for o in outs])


@other("check_dp_forward", "a pool of one worker, each replica submitted")
def dp_forward_pool_of_one(net, X, devices):
    from concurrent.futures import ThreadPoolExecutor
    replicas = [copy.deepcopy(net).to(d) for d in devices]
    pieces = [x.to(d) for x, d in zip(X.chunk(len(devices)), devices)]
    with ThreadPoolExecutor(1) as pool:
        outs = [f.result() for f in [pool.submit(r, x) for r, x in zip(replicas, pieces)]]
    return torch.cat([o.to(devices[0]) for o in outs])


@other("check_dp_forward", "replica 0 on the calling thread, the others in threads")
def dp_forward_main_and_threads(net, X, devices):
    import threading
    replicas = [copy.deepcopy(net).to(d) for d in devices]
    pieces = [x.to(d) for x, d in zip(X.chunk(len(devices)), devices)]
    outs = [None] * len(pieces)

    def forward(i):
        outs[i] = replicas[i](pieces[i])
    threads = [threading.Thread(target=forward, args=(i,)) for i in range(1, len(pieces))]
    for t in threads:
        t.start()
    forward(0)
    for t in threads:
        t.join()
    return torch.cat([o.to(devices[0]) for o in outs])


@other("check_dp_forward", "replicas copied from the one on devices[0], as replicate does")
def dp_forward_from_first(net, X, devices):
    first = copy.deepcopy(net).to(devices[0])
    replicas = [first] + [copy.deepcopy(first).to(d) for d in devices[1:]]
    outs = [r(x.to(d)) for r, x, d in zip(replicas, X.chunk(len(devices)), devices)]
    return torch.cat([o.to(devices[0]) for o in outs])


@other("check_dp_forward", "threads started by a thread, and a barrier between the replicas")
def dp_forward_nested_threads(net, X, devices):
    import threading
    replicas = [copy.deepcopy(net).to(d) for d in devices]
    pieces, outs = X.chunk(len(devices)), [None] * len(devices)
    gate = threading.Barrier(len(devices), timeout=20)

    def forward(i):
        x = pieces[i].to(devices[i])
        gate.wait()                   # every replica's piece moved before any runs
        outs[i] = replicas[i](x)

    def outer():                      # starts the other replicas' threads and waits for them
        inner = [threading.Thread(target=forward, args=(i,)) for i in range(1, len(outs))]
        for t in inner:
            t.start()
        forward(0)
        for t in inner:
            t.join()
    t = threading.Thread(target=outer)
    t.start()
    t.join()
    return torch.cat([o.to(devices[0]) for o in outs])


def test_threads_beside_the_calling_thread_pass_every_time(monkeypatch):
    """Simulated work on the calling thread beside the answer's own threads: torch's fake mode
    kept one "inside a kernel" flag for every thread, so a right answer failed most runs."""
    from helpers.checks._core import carried
    monkeypatch.setattr(carried, "_TURN_WAIT", 0.5, raising=False)
    for answer in (dp_forward_main_and_threads, dp_forward_nested_threads) * 3:
        result = quiet(helpers.checks.check_dp_forward, answer)
        assert result.status == "passed", f"{answer.__name__}: {result}"


def test_a_thread_reads_devices_while_another_is_inside_a_kernel():
    """The "inside a kernel" flag is each thread's: a simulated tensor's `.device`, read in one
    thread while another runs a kernel, is its device, never "meta"."""
    import threading

    from helpers.checks._core import FakeGPUs
    gpus = FakeGPUs(2)
    t = gpus.tensor(torch.zeros(3), 1)
    seen = []
    gpus.mode.in_kernel_invocation = True          # as inside a kernel, on this thread
    try:
        reader = threading.Thread(target=lambda: seen.append(t.device))
        reader.start()
        reader.join()
    finally:
        gpus.mode.in_kernel_invocation = False
    assert seen == [torch.device("cuda", 1)], seen


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_stalled_simulated_operation_ends_in_a_verdict(monkeypatch):
    """An answer's thread that waits past the wait for a simulated operation (held here by the
    calling thread, as by one stuck inside an operation) ends the check as the grader's
    problem, not a hang."""
    from helpers.checks._core import carried
    monkeypatch.setattr(carried, "_OP_WAIT", 0.2)
    with carried.one_simulated_op():           # reentrant: the calling thread's own ops go on
        result = quiet(helpers.checks.check_dp_forward, dp_forward_threads)
    assert result.status == "error" and "waited for another thread" in result.message, result


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_simulations_own_error_in_a_thread_is_the_graders(monkeypatch):
    """An error torch's simulation raises inside a thread the answer started (its assertion)
    kills that thread, and the answer then fails elsewhere: reported as the grader's problem,
    never as the answer's."""
    import threading

    from torch._subclasses import fake_tensor
    dispatch = fake_tensor.FakeTensorMode.dispatch

    def breaks(self, func, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread() and "addmm" in str(func):
            raise AssertionError("False, True")
        return dispatch(self, func, *args, **kwargs)
    monkeypatch.setattr(fake_tensor.FakeTensorMode, "dispatch", breaks)
    result = quiet(helpers.checks.check_dp_forward, dp_forward_threads)
    assert result.status == "error" and "simulation of the GPUs failed" in result.message, result


_REPLICAS = {}      # dp_forward_cached's cache: a module global, as a notebook's would be


@shortcut("check_dp_forward", "replicas made once per (net, devices) and reused: stale after a "
          "step", "kept across calls (a cache, a global)")
def dp_forward_cached(net, X, devices):
    key = (id(net), tuple(str(d) for d in devices))
    if key not in _REPLICAS:
        _REPLICAS[key] = [copy.deepcopy(net).to(d) for d in devices]
    outs = [r(x.to(d)) for r, x, d in zip(_REPLICAS[key], X.chunk(len(devices)), devices)]
    return torch.cat([o.to(devices[0]) for o in outs])


def test_a_rerun_of_a_caching_answer_names_what_it_kept():
    """Run again in the same process (a notebook's rerun), the cache holds the last run's
    replicas of the check's module: named as kept across calls, not as consulting the checks."""
    cache = {}

    def cached(net, X, devices):
        key = (id(net), len(devices))
        if key not in cache:
            cache[key] = [copy.deepcopy(net).to(d) for d in devices]
        return torch.cat([r(x.to(d)).to(devices[0])
                          for r, x, d in zip(cache[key], X.chunk(len(devices)), devices)])
    first = quiet(helpers.checks.check_dp_forward, cached)
    again = quiet(helpers.checks.check_dp_forward, cached)
    assert first.status == "failed" and "replicas kept across calls" in first.message, first
    assert again.status == "failed" and "kept from an earlier call" in again.message, again
    assert "course's checks" not in again.message, again


def _by_torch_parallel_apply(apply):
    """dp_forward with its replicas run by `apply` (torch's parallel_apply, however bound)."""
    def dp_forward(net, X, devices):
        replicas = [copy.deepcopy(net).to(d) for d in devices]
        pieces = [x.to(d) for x, d in zip(X.chunk(len(devices)), devices)]
        outs = apply()(replicas[:len(pieces)], pieces, devices=devices[:len(pieces)])
        return torch.cat([o.to(devices[0]) for o in outs])
    return dp_forward


_BOUND_EARLY = torch.nn.parallel.parallel_apply      # a notebook's import at the top


@pytest.mark.parametrize("apply", [lambda: torch.nn.parallel.parallel_apply,
                                   lambda: _BOUND_EARLY], ids=["looked up", "bound early"])
def test_torch_parallel_apply_is_refused_by_name(apply):
    """torch's parallel_apply raises on any device but a real GPU: refused by name, saying what
    to write instead, never "your code raised"."""
    result = quiet(helpers.checks.check_dp_forward, _by_torch_parallel_apply(apply))
    assert result.status == "failed", result
    assert "needs real CUDA devices" in result.message and "a thread per replica" in \
        result.message, result


_GATHER_EARLY = torch.nn.parallel.gather            # bound at import, as `from ... import`


def _dp_by_torch_gather(net, X, devices):
    outs = [copy.deepcopy(net).to(d)(x.to(d)) for x, d in zip(X.chunk(len(devices)), devices)]
    return _GATHER_EARLY(outs, devices[0])


def _dp_by_torch_replicate(net, X, devices):
    replicas = torch.nn.parallel.replicate(net, devices)
    pieces = [x.to(d) for x, d in zip(X.chunk(len(devices)), devices)]
    return torch.cat([r(x).to(devices[0]) for r, x in zip(replicas, pieces)])


def _dp_by_scatter_gather_module(net, X, devices):
    from torch.nn.parallel import scatter_gather
    pieces = scatter_gather.scatter(X, devices)
    return torch.cat([copy.deepcopy(net).to(x.device)(x).to(devices[0]) for x in pieces])


def _dp_by_torch_data_parallel(net, X, devices):
    return torch.nn.parallel.data_parallel(net, X, devices, devices[0])


@pytest.mark.parametrize("answer, name", [(_dp_by_torch_gather, "gather"),
                                          (_dp_by_torch_replicate, "replicate"),
                                          (_dp_by_scatter_gather_module, "scatter"),
                                          (_dp_by_torch_data_parallel, "data_parallel")])
def test_torch_parallel_steps_are_refused_by_name(answer, name):
    """torch.nn.parallel's replicate, scatter, gather and data_parallel raise on any device but a
    real GPU, as parallel_apply does: refused by name, with what to write instead."""
    result = quiet(helpers.checks.check_dp_forward, answer)
    assert result.status == "failed", result
    assert f"torch.nn.parallel.{name}, which needs real CUDA devices" in result.message, result
    assert "Instead," in result.message and "your code raised" not in result.message, result


@shortcut("check_dp_forward", "never moves anything", "simulated GPUs")
def dp_forward_no_moves(net, X, devices):
    replicas = [copy.deepcopy(net) for _ in devices]
    return torch.cat([r(x) for r, x in zip(replicas, X.chunk(len(devices)))])


@shortcut("check_dp_forward", "one replica runs every piece", "original module ran")
def dp_forward_original(net, X, devices):
    return torch.cat([net(x) for x in X.chunk(len(devices))])


@shortcut("check_dp_forward", "tensor_split", "tensor_split's sizes")
def dp_forward_split(net, X, devices):
    replicas = [copy.deepcopy(net).to(d) for d in devices]
    outs = [r(x.to(d)) for r, x, d in zip(replicas, X.tensor_split(len(devices)), devices)]
    return torch.cat([o.to(devices[0]) for o in outs])


@shortcut("check_dp_forward", "replicas run their pieces, replica 0 on the whole batch is "
          "returned", "not made of the replicas' outputs")
def dp_forward_replica0_whole(net, X, devices):
    replicas = [copy.deepcopy(net).to(d) for d in devices]
    for r, x, d in zip(replicas, X.chunk(len(devices)), devices):
        r(x.to(d))                                 # logged, then thrown away
    return replicas[0].lin(X.to(devices[0]))


@shortcut("check_dp_forward", "the pieces' outputs as a decoy: + 0 * outputs",
          "computed outside the replicas")
def dp_forward_decoy(net, X, devices):
    replicas = [copy.deepcopy(net).to(d) for d in devices]
    outs = [r(x.to(d)) for r, x, d in zip(replicas, X.chunk(len(devices)), devices)]
    return replicas[0].lin(X.to(devices[0])) + 0 * torch.cat([o.to(devices[0]) for o in outs])


@shortcut("check_dp_forward", "the whole batch at once", "ran once on all")
def dp_forward_whole(net, X, devices):
    return net(X)


test_case = parametrize_cases(__name__)
