"""The check framework (helpers/checks/_core.py): what a student sees, and what a grader sees."""
import pytest
import torch
from check_cases import not_grading  # noqa: F401 (not_grading: autouse)

from helpers.checks import CheckFailed, Result, expect, fresh_generator, run_check


def body(answer):
    expect(answer() == 42, f"answer() returned {answer()!r}, expected 42")


def test_outcomes_print_one_line(capsys):
    assert run_check("answer", body, lambda: 42).status == "passed"
    assert capsys.readouterr().out == "answer: ✔ passed\n"
    r = run_check("answer", body, lambda: 41)
    assert r.status == "failed" and not r
    assert capsys.readouterr().out == "answer: ✘ failed: answer() returned 41, expected 42\n"


def test_stub_and_crash_do_not_raise(capsys):
    def stub():
        raise NotImplementedError()
    assert run_check("answer", body, stub).status == "not done"
    assert "answer: … not done yet" in capsys.readouterr().out
    r = run_check("answer", body, lambda: 1 / 0)
    assert r.status == "failed" and "your code raised ZeroDivisionError" in r.message


@pytest.mark.parametrize("env", ["NBGRADER_EXECUTION", "COURSE_GRADING"])
def test_grading_raises_unless_passed(monkeypatch, env):
    monkeypatch.setenv(env, "autograde" if env.startswith("NB") else "1")
    assert run_check("answer", body, lambda: 42)
    with pytest.raises(CheckFailed, match="answer: ✘ failed: answer\\(\\) returned 41"):
        run_check("answer", body, lambda: 41)
    with pytest.raises(CheckFailed, match="not done yet"):
        run_check("answer", body, lambda: (_ for _ in ()).throw(NotImplementedError()))


def test_result_is_shown_once_in_a_notebook():
    """run_check prints the line; IPython must not show the returned Result a second time."""
    r = Result("answer", "passed")
    assert r._ipython_display_() is None
    assert repr(r) == "answer: ✔ passed"


def test_fresh_generator_is_fresh_and_leaves_torch_alone():
    state = torch.get_rng_state()
    a = torch.rand(4, generator=fresh_generator())
    b = torch.rand(4, generator=fresh_generator())
    assert not torch.equal(a, b)
    assert torch.equal(state, torch.get_rng_state())
    assert torch.equal(torch.rand(3, generator=fresh_generator(7)),
                       torch.rand(3, generator=fresh_generator(7)))


# ---- the harness (helpers/checks/_core/) -----------------------------------------------------
import numpy as np  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import helpers  # noqa: E402
import helpers.checks._core.world as world_module  # noqa: E402
from helpers.checks._core import (  # noqa: E402
    FakeGPUs,
    HarnessError,
    World,
    as_int,
    as_number,
    check,
    gamma,
    rel_close,
)
from helpers.checks._core.fresh import regrade  # noqa: E402


@check("saved_bytes", observes=["what came back"], references=["saved_per_layer"])
def check_demo(fn):
    expect(fn(3) == 6, f"demo(3) returned {fn(3)!r}, expected 6")


ALIAS = helpers.saved_per_layer


def test_blame_falls_on_the_answer_or_on_the_check(capsys):
    assert check_demo(lambda n: 2 * n)
    r = check_demo(lambda n: [][1])
    assert r.status == "failed" and "your code raised IndexError" in r.message

    @check("demo", observes=["nothing"])
    def check_broken(fn):
        {}["missing"]                  # the check's own bug, not the answer's
    r = check_broken(lambda: 1)
    assert r.status == "error" and "not your answer" in repr(r)


def test_a_harness_error_raises_as_such_while_grading(monkeypatch):
    monkeypatch.setenv("COURSE_GRADING", "1")

    @check("demo", observes=["nothing"])
    def check_broken(fn):
        raise KeyError("the check's own bug")
    with pytest.raises(HarnessError):
        check_broken(lambda: 1)


def test_torch_not_implemented_is_not_a_stub():
    def answer(n):
        raise NotImplementedError("this is torch's, deep down")
    # raised by the answer itself: the stub convention; it says "not done"
    assert check_demo(answer).status == "not done"


@pytest.mark.parametrize("answer,words", [
    (lambda n: ALIAS and 6, "through <lambda> → ALIAS"),                 # bound earlier
    (lambda n, f=helpers.saved_per_layer: 6, "default"),                  # a default argument
    (lambda n: helpers.saved_per_layer and 6, "saved_per_layer"),        # module attribute
    (lambda n: getattr(helpers, "saved_" + "per_layer")(n, n), "called"),   # computed name
])
def test_a_reference_is_refused_by_identity(answer, words):
    r = check_demo(answer)
    assert r.status == "failed" and "course's own answer" in r.message and words in r.message


def test_a_reference_caught_by_the_answer_still_fails():
    def answer(n):
        try:
            getattr(helpers, "saved_per_" + "layer")(None, None)   # unseen by the scan
        except BaseException:
            pass
        return 6
    r = check_demo(answer)
    assert r.status == "failed" and "course's own answer" in r.message
    assert helpers.saved_per_layer is ALIAS          # restored after the check


def test_an_import_inside_the_answer_is_seen():
    def answer(n):
        from helpers import num_params, saved_per_layer  # noqa: F401
        return 6
    assert "course's own answer" in check_demo(answer).message


def test_an_own_function_of_the_same_name_is_fine():
    def saved_per_layer(n):
        return 2 * n

    def answer(n):
        return saved_per_layer(n) if helpers.num_params else 0
    assert check_demo(answer)


def test_an_answer_that_consults_the_checks_is_refused():
    import helpers.checks as hc
    r = check_demo(lambda n: hc.check_demo and 6)
    assert r.status == "failed" and "course's checks" in r.message


def test_numbers_of_any_real_type():
    assert as_number(np.int64(3), "f") == 3 and as_number(np.float32(0.5), "f") == 0.5
    assert as_number(torch.tensor(2.0), "f") == 2 and as_number(np.array(4), "f") == 4
    assert as_int(np.float64(3.0), "f") == 3
    for bad in (True, "3", [3], torch.ones(2)):
        with pytest.raises(CheckFailed):
            as_number(bad, "f")
    assert as_number(torch.tensor(1.0, dtype=torch.float32), "f", with_dtype=True)[1] == \
        torch.float32
    assert rel_close(1 + 2 * gamma(1), 1, 3) and not rel_close(1 + 1e-12, 1, 3)


def test_fake_gpus_see_placement_crossings_and_work():
    gpus = FakeGPUs(2)
    X = gpus.tensor(torch.randn(2, 6, 5, 5), 0)
    W = gpus.tensor(torch.randn(3, 6, 3, 3), 0)

    def split(X, W, devices):
        parts = [F.conv2d(Xi.to(d), Wi.to(d))
                 for Xi, Wi, d in zip(X.tensor_split(2, 1), W.tensor_split(2, 1), devices)]
        return parts[0] + parts[1].to(devices[0])
    Y, rec = gpus.run(split, X, W, gpus.devices)
    assert Y.device == gpus.devices[0]
    work = rec.work_by_device()
    assert set(work) == set(gpus.devices)
    moves = [(op.src_device.index, op.outputs[0].device.index) for op in rec.transfers()]
    assert moves == [(0, 1), (0, 1), (1, 0)]
    assert [op.name for op in rec.ancestors(Y)][-1] == "add"
    assert sum(op.name == "convolution" for op in rec.ancestors(Y)) == 2


def test_fake_gpus_name_the_tensors_an_operation_mixed():
    gpus = FakeGPUs(2)
    a, b = gpus.tensor(torch.ones(3), 0), gpus.tensor(torch.ones(3), 1)
    with pytest.raises(CheckFailed, match=r"\[3\] tensor on cuda:0.*\[3\] tensor on cuda:1"):
        gpus.run(lambda: a + b)


def test_fake_gpus_move_modules_and_answer_scalars():
    gpus = FakeGPUs(3)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    def place(net, devices):
        import copy
        stages = [copy.deepcopy(net[:2]).to(devices[1]), copy.deepcopy(net[2:]).to(devices[2])]
        stages[1].to(devices[0])                       # moved twice: a swap of fake tensors
        x = torch.zeros(5, 3, device=devices[1])
        return stages, stages[0](x).sum().item()
    (stages, value), _ = gpus.run(place, net, gpus.devices)
    assert [p.device.index for s in stages for p in s.parameters()] == [1, 1, 0, 0]
    assert value == 0.0                                # a placeholder: values are not simulated
    assert all(p.device.type == "cpu" for p in net.parameters())


def test_world_collectives_in_every_form():
    world = World(3, record_ops=True)

    def fn(comm):
        r = comm.rank
        t = torch.full((4,), float(r))
        dist.all_reduce(t)
        outs = [torch.zeros(2) for _ in range(3)]
        dist.all_gather(outs, torch.full((2,), float(r)))
        flat = torch.zeros(6)
        dist.all_gather_into_tensor(flat, torch.full((2,), float(r)))
        a, b = torch.zeros(2), torch.zeros(2)
        dist.reduce_scatter(a, [torch.full((2,), float(i + r)) for i in range(3)])
        dist.reduce_scatter_tensor(b, torch.arange(6.0) + r)
        g = dist.new_group([0, 2])
        s = torch.ones(1) * r
        if r in (0, 2):
            dist.all_reduce(s, group=g)
        return t, outs, flat, a, b, s
    res = world.run(fn)
    assert torch.equal(res[1][0], torch.full((4,), 3.0))
    assert [o.tolist() for o in res[0][1]] == [[0, 0], [1, 1], [2, 2]]
    assert res[2][2].tolist() == [0, 0, 1, 1, 2, 2]
    assert res[1][3].tolist() == [6, 6]                 # sum over ranks of (1 + r)
    assert res[2][4].tolist() == [15, 18]               # chunk 2 of arange(6) + r, summed
    assert res[0][5].item() == 2 and res[1][5].item() == 1
    assert [m.op for m in world.sent(rank=0)][:5] == [
        "all_reduce", "all_gather", "all_gather", "reduce_scatter", "reduce_scatter"]
    assert world.recorders[0] is not None and world.recorders[0].ops


def test_world_async_results_arrive_when_every_rank_launched(monkeypatch):
    """As on gloo: complete once every rank launched it; the wait is recorded where it waits."""
    world = World(2)
    monkeypatch.setattr(world_module, "is_reader_code", lambda f: False)   # marks as a check's

    def fn(comm, peek=False):
        t = torch.ones(3)
        work = dist.all_reduce(t, async_op=True)
        if peek:            # reading it before the wait is a race on gloo: inflight.py
            t.clone()
        else:
            world.mark("between")
        work.wait()
        return t
    res = world.run(fn)
    assert res[0].tolist() == [2, 2, 2]
    kinds = [k for _, k, _ in world.timeline[0]]
    assert kinds == ["launch", "mark", "wait"]
    assert world.messages[0].async_op and world.messages[0].waited is not None
    with pytest.raises(CheckFailed, match=r"ran torch's clone on the tensor of rank \d's"):
        World(2).run(fn, True)


def test_world_point_to_point_and_failures():
    world = World(2)

    def fn(comm):
        if comm.rank == 0:
            comm.send(torch.arange(3.0), 1, tag=7)
            dist.send(torch.ones(2), 1)
            comm.wait()
            return None
        got = comm.recv(0, (3,), tag=7)
        buf = torch.zeros(2)
        dist.recv(buf, 0)
        return got, buf
    res = world.run(fn)
    assert res[1][0].tolist() == [0, 1, 2] and res[1][1].tolist() == [1, 1]
    assert sorted((m.op, m.src, m.dst, m.shape) for m in world.messages) == [
        ("recv", 0, 1, (2,)), ("recv", 0, 1, (3,)), ("send", 0, 1, (2,)), ("send", 0, 1, (3,))]
    with pytest.raises(ZeroDivisionError):
        World(2, timeout=2).run(lambda comm: dist.all_reduce(torch.ones(1)) if comm.rank
                                else 1 / 0)


def test_world_restores_torch_distributed():
    before = dist.all_reduce
    World(2).run(lambda comm: dist.all_reduce(torch.ones(1)))
    assert dist.all_reduce is before


def test_regrade_ignores_a_patched_check(monkeypatch, capsys):
    import helpers.checks as hc
    monkeypatch.setattr(hc, "check_matmul_flops", lambda fn: print("looks right"))
    monkeypatch.setattr(hc._core.run, "expect", lambda *a: None)
    with pytest.raises(AssertionError, match="matmul_flops"):
        regrade("check_matmul_flops", lambda n: 0)
    assert regrade("check_matmul_flops", lambda n: 2 * n**3)
