"""What only a GPU would show, caught on a CPU: every launch target of the chapters runs on fake
GPUs (tests/fake_cuda.py: cuda:<rank> under NCCL's rules, real values on the CPU), and must keep
every tensor on its rank's GPU, hand NCCL no CPU tensor, read no host timer while GPU work is
queued, and return its results on the CPU; a static read of the code checks that every launch
target takes its device from cfg["device"] and reads the clock through the rank clock; and the
backend and device rule of helpers.setup is checked against made-up machines.

Problems are reported by the area whose code they are in (each area keeps its own files right):
a (target, area) pair listed in KNOWN is a known problem, not yet fixed (an expected
failure: it fails the test the day it passes, so the list stays true)."""
import ast
import functools
import os
import tempfile
from pathlib import Path

import chapter_targets as ct
import fake_cuda_targets
import pytest
import torch

import helpers
from helpers.runtime.checkpoint import rng_state

ROOT = Path(__file__).resolve().parent.parent
AREAS = ("core", "part4", "part3", "part7")
# (target, area): known problems in that area's code, not yet fixed, with why (strict xfails:
# an XPASS says the pair can be removed). None today: the first GPU run's world-1 sweep failed
# on scratch_refusals, ddp_knobs and ddp_trace, which this test had listed here.
KNOWN = {}
# areas whose static rules below are known to fail, with why (none today)
KNOWN_AREAS = {}
SPEED_B_FUNCTIONS = {"bn_vs_syncbn", "bn_grads_same_weights",
                     "convert_sync_batchnorm", "CPUSyncBatchNorm", "bn_net", "bn_stats",
                     "train_bn_steps", "global_batches"}


def area_of(path, function=""):
    """Which area keeps `path` (repository-relative) right."""
    p = path.replace(os.sep, "/")
    if p.startswith(("helpers/context_parallel/", "helpers/expert_parallel/",
                     "helpers/composed/")) or p in ("helpers/tensor_parallel/sequence.py",
                                                    "helpers/transformer_costs.py"):
        return "part7"
    if p in ("helpers/data_parallel/overlap_experiments.py", "helpers/data_parallel/scratch.py",
             "helpers/data_parallel/scratch_experiments.py",
             "helpers/data_parallel/torch_api.py", "helpers/data_parallel/syncbn_experiments.py",
             "helpers/data_parallel/dp_vs_ddp_experiments.py",
             "helpers/devices.py"):
        return "part3"
    if p == "helpers/data_parallel/experiments.py":
        return "part3" if function in SPEED_B_FUNCTIONS else "part4"
    if p.startswith("helpers/data_parallel/") or p in ("helpers/timing.py",
                                                        "helpers/profiling.py",
                                                        "scripts/bench.py"):
        return "part4"
    return "core"


def _area_of_problem(at, owner):
    """The area of a problem's location "path:line (function)" ("?" or unknown: the target's
    owner)."""
    if at == "?" or ":" not in at:
        return owner
    path, rest = at.split(":", 1)
    function = rest.split("(", 1)[-1].rstrip(")") if "(" in rest else ""
    return area_of(path, function)


# ---- the sweep: every launch target on fake GPUs ------------------------------------------------
def _rows():
    return [t for t in ct.targets(tempfile.gettempdir()) if not t.gloo_only]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """{target: [(area, kind, where, what)], ...} from one launch of 2 ranks (and one of 4),
    each target in turn on cuda:<rank>, plus the canaries' reports."""
    tmp = str(tmp_path_factory.mktemp("fake"))
    rows = [t for t in ct.targets(tmp) if not t.gloo_only]
    found = {}
    for world in sorted({t.world for t in rows}):
        mine = [t for t in rows if t.world == world]
        runs = [(t.name, t.fn, t.cfg) for t in mine]
        if world == 2:
            runs += [(name, fake_cuda_targets.canary, dict(bug=name))
                     for name in fake_cuda_targets.CANARIES]
        got = helpers.launch(fake_cuda_targets.on_fake_gpus, world, dict(runs=runs), backend="gloo",
                             quiet=True, timeout=600)
        owners = {t.name: t.owner for t in mine}
        for name, *_ in runs:
            problems = []
            for rank, report in enumerate(got):
                rep = report[name]
                for kind, at, what in rep["problems"]:
                    problems.append((_area_of_problem(at, owners.get(name, "core")), kind, at,
                                     f"rank {rank}: {what}"))
                if rep["result_on_gpu"]:
                    problems.append((owners.get(name, "core"), "returns tensors on its GPU",
                                     "result", f"rank {rank}: {rep['result_on_gpu']}: gather "
                                     "results to the CPU (.cpu())"))
            found[name] = problems
    return found


def _check(sweep, name, areas):
    got = [p for p in sweep[name] if p[0] in areas]
    assert not got, f"{name} on fake GPUs:\n" + "\n".join(
        f"  [{area}] {kind} at {at}: {what}" for area, kind, at, what in got)


@pytest.mark.parametrize("name", [t.name for t in _rows()])
def test_launch_target_keeps_to_its_gpu(sweep, name):
    """Everything a rank touches on its GPU, NCCL given GPU tensors only, timers that wait for
    the GPU, results on the CPU (in every area's code but the pairs KNOWN lists)."""
    _check(sweep, name, {a for a in AREAS if (name, a) not in KNOWN})


@pytest.mark.parametrize("name,area", [   # (none known: pytest skips it)
    pytest.param(n, a, marks=pytest.mark.xfail(strict=True, reason=why))
    for (n, a), why in sorted(KNOWN.items())])
def test_launch_target_keeps_to_its_gpu_elsewhere(sweep, name, area):
    _check(sweep, name, {area})


@pytest.mark.parametrize("bug", sorted(fake_cuda_targets.CANARIES))
def test_the_fake_gpus_catch_each_kind_of_mistake(sweep, bug):
    """A target that makes one mistake on purpose is reported for it (else the sweep above
    would pass whatever the code did)."""
    kinds = {kind for _, kind, _, _ in sweep[bug]}
    want = fake_cuda_targets.CANARIES[bug]
    assert (want in kinds) if want else not kinds, (bug, sweep[bug])


# ---- timelines on a GPU: the GPU's times, not the host's ----------------------------------------
COMM = 0.25     # seconds each all-reduce takes on the fake GPU (the host queues it at once)


@pytest.fixture(scope="module")
def slow():
    """DDPFromScratch's timeline and exposed communication on a fake GPU whose all-reduces take
    COMM seconds each, one after another, while their futures complete at launch (NCCL's).
    Only the all-reduces take time: the wrappers' set-up broadcasts (ten a model) would only
    make the host sleep (CI: 20 s of sleep, 3 s without them); ddp_knobs, checked for its
    clock reads and not timed, gets short ones (31 all-reduces)."""
    return helpers.launch(fake_cuda_targets.slow_comm, 1, dict(
        comm=dict(timeline=COMM, exposed=COMM, knobs=0.02), comm_ops={"allreduce_"}, runs=[
            ("timeline", helpers.gradient_timeline, dict(bucket_mb=0.004, repeats=1)),
            ("exposed", helpers.exposed_comm_times, dict(bucket_mb=0.004, rounds=1, warmup=0)),
            ("knobs", helpers.ddp_knobs, dict(width=32, depth=2, batch=8, steps=1, rounds=1,
                                              trace_steps=1))]),
        backend="gloo", quiet=True, timeout=300)[0]


def test_the_scratch_ddp_timeline_is_the_gpus(slow):
    """On a GPU an NCCL all-reduce's future completes when it is queued, so a host
    clock in its callback says "done" at launch and every bucket would seem to finish before
    backward returned. The timeline must say when the GPU finished each all-reduce."""
    t = slow["timeline"]["result"]
    launch = {i: s for s, what, i in t.events if what == "launch"}
    done = {i: s for s, what, i in t.events if what == "done"}
    assert set(done) == set(launch) and len(launch) > 1, t.events
    for k, i in enumerate(sorted(launch)):    # one after another, COMM each, from the first
        assert done[i] >= launch[0] + (k + 1) * COMM * 0.9, (i, done[i], launch[0])
    assert t.backward_s < min(done.values()), "no all-reduce can be done before it ran"
    assert t.finish_s >= len(launch) * COMM * 0.9, "finish waits for the GPU's all-reduces"
    assert not slow["timeline"]["problems"], slow["timeline"]["problems"]


def test_the_exposed_communication_is_the_gpus(slow):
    """exposed_comm_times on the same fake GPU: every all-reduce is still running when the last
    gradient is ready (each takes COMM), and the step waits for all of them after it."""
    got = slow["exposed"]["result"]
    n = got.num_buckets
    for mode, m in got.modes().items():
        assert m.pending == [n], (mode, m)
        assert m.exposed[0] >= (n - 1) * COMM, (mode, m)
    assert not slow["exposed"]["problems"], slow["exposed"]["problems"]


def test_ddp_knobs_read_no_host_clock_around_gpu_work(slow):
    got = slow["knobs"]["result"]
    assert all(len(v) == 1 for v in got.step_s.values()), got
    assert not slow["knobs"]["problems"], slow["knobs"]["problems"]


# ---- static rules -------------------------------------------------------------------------------
@functools.cache
def _parsed(path):
    return ast.parse(Path(path).read_text())


def _launch_targets():
    """(path, function node) of every fn(rank, world|world_size, cfg) in helpers/."""
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        if "checks" in path.parts:
            continue
        for node in _parsed(str(path)).body:
            if isinstance(node, ast.FunctionDef) and \
                    [a.arg for a in node.args.args] in (["rank", "world", "cfg"],
                                                        ["rank", "world_size", "cfg"]):
                yield path.relative_to(ROOT).as_posix(), node


def test_every_launch_target_is_in_the_sweep():
    names = {t.name.split(":")[0] for t in ct.targets(tempfile.gettempdir())}
    missing = [f"{p}::{n.name}" for p, n in _launch_targets()
               if n.name not in names and n.name not in ct.COVERED_BY]
    assert not missing, f"add these launch targets to tests/chapter_targets.py: {missing}"


def _reads_device(node, targets):
    for n in ast.walk(node):
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and \
                n.value.id == "cfg" and isinstance(n.slice, ast.Constant) and \
                n.slice.value == "device":
            return True
        if isinstance(n, ast.Call):
            args = n.args
            name = n.func.id if isinstance(n.func, ast.Name) else \
                n.func.attr if isinstance(n.func, ast.Attribute) else ""
            if name in ("take", "get") and any(isinstance(a, ast.Constant) and
                                               a.value == "device" for a in args):
                return True
            if name in targets and len(args) == 3 and isinstance(args[2], ast.Name) and \
                    args[2].id == "cfg":
                return True          # hands its cfg (device and all) to another launch target
    return False


def _areas():
    return [pytest.param(a, marks=pytest.mark.xfail(strict=True, reason=KNOWN_AREAS[a])
                         if a in KNOWN_AREAS else ()) for a in AREAS]


@pytest.mark.parametrize("area", _areas())
def test_launch_targets_take_their_device_from_cfg(area):
    """No launch target ignores cfg["device"] (the rank's GPU under NCCL), except those its
    chapters launch on gloo only."""
    gloo = {t.name for t in ct.targets(tempfile.gettempdir()) if t.gloo_only}
    found = list(_launch_targets())
    targets = {n.name for _, n in found}
    ignoring = [f"{p}::{n.name}" for p, n in found
                if area_of(p, n.name) == area and n.name not in gloo
                and n.name != "run_in_turn" and not _reads_device(n, targets)]
    assert not ignoring, f"these launch targets never read cfg['device']: {ignoring}"


RANK_CODE = ("helpers/runtime", "helpers/sharding", "helpers/tensor_parallel",
             "helpers/pipeline_parallel", "helpers/data_parallel", "helpers/context_parallel",
             "helpers/expert_parallel", "helpers/composed", "scripts/ddp")
CLOCKS = {}   # rank code reads helpers.devices' rank clock (emulate.Clock too), never its own
CPU_ONLY = {"helpers/pipeline_parallel/simulated.py": "one process simulating devices with "
                                                      "threads on the CPU",
            "helpers/data_parallel/simulated.py": "one process simulating devices on the CPU"}


def _enclosing(tree):
    """{id(node): name of the innermost function around it}."""
    names = {}

    def visit(node, name):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else name
            names[id(child)] = inner
            visit(child, inner)
    visit(tree, "<module>")
    return names


def _bare_clock_reads(area):
    out = []
    for folder in RANK_CODE:
        for path in sorted((ROOT / folder).glob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in CPU_ONLY:
                continue
            tree = _parsed(str(path))
            names = _enclosing(tree)
            for n in ast.walk(tree):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                        n.func.attr in ("perf_counter", "perf_counter_ns") and \
                        isinstance(n.func.value, ast.Name) and n.func.value.id == "time":
                    name = names[id(n)]
                    if name not in CLOCKS.get(rel, ()) and area_of(rel, name) == area:
                        out.append(f"{rel}:{n.lineno} ({name})")
    return sorted(out)


@pytest.mark.parametrize("area", _areas())
def test_rank_code_reads_the_rank_clock(area):
    """Rank code times with helpers.synced_now(device) (or Timer, measure, CUDA events, the
    emulated Clock, which reads synced_now), never a bare time.perf_counter(): around GPU work
    it measures the queueing."""
    bare = _bare_clock_reads(area)
    assert not bare, f"bare host timers in rank code: {bare}"


# ---- the backend and device rule ----------------------------------------------------------------
class Machine:
    """A made-up machine for helpers.setup: `gpus` GPUs; records set_device and
    init_process_group's arguments instead of joining a group."""

    def __init__(self, monkeypatch, gpus):
        from helpers.runtime import group
        self.set_device, self.init = [], None
        monkeypatch.setattr(group, "num_gpus", lambda: gpus)
        monkeypatch.setattr("helpers.validate.num_gpus", lambda: gpus)
        monkeypatch.setattr(group.dist, "is_nccl_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: self.set_device.append(d))
        monkeypatch.setattr(group, "_loopback_store", lambda *a: None)
        monkeypatch.setattr(group, "_attempt_store", lambda *a: None)
        monkeypatch.setattr(group, "die_with_parent", lambda pid: None)
        monkeypatch.setattr(group.dist, "init_process_group",
                            lambda backend, **kw: setattr(self, "init", (backend, kw)))
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        self.setup = group.setup


@pytest.mark.parametrize("gpus,ranks,backend,want", [
    (0, 2, None, ("gloo", "cpu")),
    (1, 2, None, ("gloo", "cpu")),          # ranks outnumber GPUs: CPU, CUDA untouched
    (2, 2, None, ("nccl", "cuda:1")),
    (2, 2, "gloo", ("gloo", "cuda:1")),     # gloo with a GPU per rank: CUDA tensors
    (1, 1, None, ("nccl", "cuda:0"))])
def test_the_device_is_chosen_after_the_backend(monkeypatch, gpus, ranks, backend, want):
    m = Machine(monkeypatch, gpus)
    _, _, device = m.setup(rank=ranks - 1, world_size=ranks, backend=backend, master_port=1)
    assert (m.init[0], str(device)) == want
    assert m.set_device == ([device] if device.type == "cuda" else []), \
        "a rank computing on the CPU must not create a CUDA context"
    assert m.init[1].get("device_id") == (device if m.init[0] == "nccl" else None), \
        "NCCL binds the group to the rank's GPU (device_id), gloo takes none"


def test_launched_gloo_ranks_compute_on_the_cpu_on_a_gpu_machine(monkeypatch):
    m = Machine(monkeypatch, 2)
    _, _, device = m.setup(rank=1, world_size=2, backend="gloo", master_port=1, device="cpu")
    assert device == torch.device("cpu") and m.set_device == []


def test_several_machines_never_fall_back_by_themselves(monkeypatch):
    m = Machine(monkeypatch, 1)
    env = dict(RANK="2", LOCAL_RANK="0", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2",
               MASTER_ADDR="10.0.0.1", MASTER_PORT="29500")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(RuntimeError, match="name the backend on every one"):
        m.setup()
    assert m.init is None, "refused before joining"
    _, _, device = m.setup(backend="gloo")
    assert m.init[0] == "gloo" and device.type == "cpu"
    m2 = Machine(monkeypatch, 2)
    _, _, device = m2.setup()
    assert m2.init[0] == "nccl" and device == torch.device("cuda", 0)


def test_sizes_follow_the_device_the_run_uses(monkeypatch, capsys):
    monkeypatch.delenv("COURSE_QUICK", raising=False)
    monkeypatch.delenv("COURSE_FULL", raising=False)
    monkeypatch.setattr("helpers.devices.num_gpus", lambda: 1)
    assert helpers.choose("full", "small", what="in process") == "full"
    assert helpers.choose("full", "small", what="two ranks", ranks=2) == "small", \
        "2 ranks on 1 GPU run gloo on CPU cores: CPU sizes"
    assert "2 ranks but 1 GPU:" in capsys.readouterr().out
    assert helpers.choose("full", "small", what="one rank", ranks=1) == "full"
    capsys.readouterr()
    same = dict(steps=2)
    assert helpers.choose(same, dict(same), what="one size", ranks=2) == same
    assert "reduced size" not in capsys.readouterr().out, "nothing was scaled down"
    monkeypatch.setenv("COURSE_QUICK", "1")
    assert helpers.choose(same, same, what="one size, quick", tiny=dict(steps=1)) == dict(steps=1)
    assert "quick mode" in capsys.readouterr().out
    monkeypatch.setattr("helpers.runtime.group.num_gpus", lambda: 2)
    monkeypatch.setattr("helpers.runtime.group.dist.is_nccl_available", lambda: True)
    assert helpers.backend_for(1, 2) == "nccl" and helpers.backend_for(1, 2, 4) == "gloo"


def test_rng_state_reads_only_the_ranks_own_gpu(monkeypatch):
    reads = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_rng_state",
                        lambda device: reads.append(device) or torch.get_rng_state())
    monkeypatch.setattr(torch.cuda, "get_rng_state_all",
                        lambda: pytest.fail("every GPU's generator read (a context on each)"))
    state = rng_state()
    assert reads == [3] and state["cuda"]["device"] == 3
    put = []
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device: put.append(device))
    helpers.set_rng_state(state)
    helpers.set_rng_state(dict(state, cuda=[state["cuda"]["state"]] * 4))   # the older format
    assert put == [3, 3]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert "cuda" not in rng_state(), "a rank that never used CUDA does not wake it"
