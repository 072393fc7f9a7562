"""The facts about torch's DDP that the chapters state, checked against torch's own DDP: the
knobs of fixes.ipynb ("DDP's own knobs", Exercise 4's worked answer and `ddp_buckets`), the
table of ddp_scratch.ipynb (what torch's reducer does that ours does not) and the comm hooks
of ddp_torchrun.ipynb. DDP runs in this process on a fake process group of two ranks (torch's
testing backend: its collectives move nothing), so what DDP hands a comm hook is what it would
send, bucket by bucket."""
import inspect

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

MiB = 2 ** 20


@pytest.fixture(scope="module", autouse=True)
def fake_world():
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if dist.is_initialized():
        pytest.skip("a process group is already running in this process")
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    yield
    dist.destroy_process_group()


def _mlp():
    """8 layers of 512: each weight exactly 1 MiB of float32 gradients, 8 MiB in all."""
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])


def _buckets(steps=2, **ddp_kwargs):
    """Per iteration, the buckets DDP hands its comm hook: (index, MiB, parameter names)."""
    net = _mlp()
    names = {id(p): n for n, p in net.named_parameters()}
    model, seen = DDP(net, **ddp_kwargs), []

    def record(state, bucket):
        seen[-1].append((bucket.index(), bucket.buffer().numel() * 4 / MiB,
                         [names[id(p)] for p in bucket.parameters()]))
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    model.register_comm_hook(None, record)
    X = torch.randn(4, 512)
    for _ in range(steps):
        seen.append([])
        model.zero_grad()
        model(X).sum().backward()
    return seen


def test_the_default_caps_are_25_mib_and_a_first_bucket_of_1_mib():
    from torch.nn.parallel import distributed
    assert distributed._DEFAULT_BUCKET_CAP_MB == 25
    assert dist._DEFAULT_FIRST_BUCKET_BYTES == MiB


@pytest.mark.parametrize("kwargs, before", [({}, 1), (dict(static_graph=True), 2)])
def test_first_iterations_one_bucket_then_rebuilt_in_arrival_order(kwargs, before):
    """find_unused_parameters=False: one bucket for every parameter in the first iteration
    (static_graph=True: in the first two, the second recording the graph); then buckets rebuilt
    in the order the gradients arrived, the first closed at 1 MiB (the last layer's gradients
    leave first), the others at 25 MiB."""
    seen = _buckets(steps=before + 1, **kwargs)
    assert all(len(b) == 1 and len(b[0][2]) == 16 for b in seen[:before]), seen
    rebuilt = seen[before]
    assert [(i, round(mb, 2), set(p)) for i, mb, p in rebuilt[:1]] == \
        [(0, 1.0, {"7.weight", "7.bias"})], rebuilt
    assert len(rebuilt) == 2 and round(rebuilt[1][1], 2) == 7.01, rebuilt


def test_an_explicit_cap_has_no_small_first_bucket():
    """The 1 MiB first bucket is used only when bucket_cap_mb is left at its default."""
    _, second = _buckets(bucket_cap_mb=25)
    assert len(second) == 1 and len(second[0][2]) == 16, second


def test_find_unused_parameters_never_rebuilds_and_reduces_the_1_mib_bucket_last():
    """find_unused_parameters=True: no rebuild; buckets follow the parameters in reverse order
    of definition, and the 1 MiB bucket holds the parameter defined first, reduced last."""
    first, second = _buckets(find_unused_parameters=True)
    assert first == second
    small = [b for b in second if round(b[1], 2) == 1.0]
    assert small == [(len(second) - 1, 1.0, ["0.weight"])], second


def test_a_hook_receives_the_undivided_sum_and_torchs_hooks_divide_it():
    """Without a hook DDP divides each gradient by the world size; a hook gets the bucket
    undivided and must divide itself, as torch's allreduce_hook (and the compressing hooks,
    on their compressed copy) do."""
    net, ref = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
    ref.load_state_dict(net.state_dict())
    model, got = DDP(net), {}

    def hook(state, bucket):
        got["received"] = bucket.buffer().clone()
        try:
            default_hooks.allreduce_hook(state, bucket).wait()
        except RuntimeError:   # the fake all-reduce returns no tensor: its division is done
            pass
        got["divided"] = bucket.buffer().clone()
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    model.register_comm_hook(None, hook)
    X = torch.randn(3, 4)
    model(X).sum().backward()
    ref(X).sum().backward()
    local = torch.cat([ref.bias.grad, ref.weight.grad.reshape(-1)])
    assert torch.equal(got["received"].sort().values, local.sort().values), "undivided"
    assert torch.allclose(got["divided"] * 2, got["received"]), "allreduce_hook divides by 2"
    assert "div_(world_size)" in inspect.getsource(default_hooks._compress_hook)
    for h in (default_hooks.bf16_compress_hook, default_hooks.fp16_compress_hook):
        assert "return _compress_hook(" in inspect.getsource(h), h.__name__


# --- turning DDP's forward-time buffer broadcast off (custom_modules.ipynb, syncbn.ipynb) -------
def _bn_model():
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))


def _keep(state, bucket):
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def test_the_courses_buffer_keyword_raises_no_deprecation_warning_and_stops_the_broadcast():
    """helpers' spelling of "no buffer broadcast in forward" (no_forward_buffer_sync, used by
    bn_grads_same_weights) constructs DDP with warnings as errors: on torch 2.13 on, where
    `broadcast_buffers` is deprecated, passing it would raise a FutureWarning here. Then no
    forward broadcasts the buffers."""
    import warnings

    from helpers.data_parallel.torch_api import no_forward_buffer_sync
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = DDP(_bn_model(), **no_forward_buffer_sync())
    broadcasts, sync = [], model._sync_buffers
    model._sync_buffers = lambda: broadcasts.append(1) or sync()
    model.register_comm_hook(None, _keep)   # (the fake all-reduce returns no tensor)
    for _ in range(2):
        model(torch.randn(8, 4)).sum().backward()
    assert not model.broadcast_buffers and broadcasts == [], broadcasts


def test_the_buffer_keyword_follows_ddps_signature():
    """forward_sync_buffers where DDP has it (2.13 on), broadcast_buffers where it does not
    (torch 2.11, the course's floor)."""
    from helpers.data_parallel.torch_api import no_forward_buffer_sync

    class OldDDP:
        def __init__(self, module, device_ids=None, broadcast_buffers=True):
            pass
    assert no_forward_buffer_sync(OldDDP) == {"broadcast_buffers": False}
    has_new = "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    assert no_forward_buffer_sync() == ({"forward_sync_buffers": False} if has_new
                                        else {"broadcast_buffers": False})


def test_the_two_keywords_differ_at_construction(monkeypatch):
    """What the chapters say of torch 2.13 on: `broadcast_buffers` warns (FutureWarning);
    `forward_sync_buffers=False` still broadcasts the buffers once at construction,
    `broadcast_buffers=False` does not (DDP's _sync_module_states, its broadcast_buffers
    argument)."""
    if "forward_sync_buffers" not in inspect.signature(DDP.__init__).parameters:
        pytest.skip("this torch predates forward_sync_buffers (2.13)")
    from torch.nn.parallel import distributed
    seen = []
    real = distributed._sync_module_states
    monkeypatch.setattr(distributed, "_sync_module_states",
                        lambda **kw: seen.append(kw["broadcast_buffers"]) or real(**kw))
    DDP(_bn_model(), forward_sync_buffers=False)
    with pytest.warns(FutureWarning, match="broadcast_buffers"):
        DDP(_bn_model(), broadcast_buffers=False)
    assert seen == [True, False], seen


def test_no_ddp_call_in_the_course_passes_broadcast_buffers():
    """Every DDP(...) in helpers/ and scripts/ spells the buffer keyword through
    no_forward_buffer_sync (deprecated in torch 2.13 on: a FutureWarning in every rank)."""
    import ast
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    found = []
    for folder in ("helpers", "scripts"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and any(k.arg == "broadcast_buffers"
                                                      for k in node.keywords):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, f"pass **no_forward_buffer_sync() instead: {found}"


# --- the collectives DDP runs, counted on a real one-process gloo group (custom_modules.ipynb,
# ddp_torchrun.ipynb, ddp_scratch.ipynb) -------------------------------------------------------
_COUNT_SCRIPT = """
import json, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
import helpers
dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
out = {"direct": helpers.collectives_in(
    lambda: (dist.all_reduce(torch.ones(3)), dist.broadcast(torch.ones(2), 0)))}
for flag in (False, True):
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)),
                find_unused_parameters=flag)
    X = torch.randn(3, 4)
    out[str(flag)] = helpers.ddp_step_collectives(model, lambda m: m(X).sum())
dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def counted():
    """helpers.collectives_in and ddp_step_collectives on a one-process gloo group, in a
    process of its own (this module's fake group holds the default group here)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", _COUNT_SCRIPT], capture_output=True, text=True,
                         timeout=300, env=env, cwd=root)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_collectives_in_lists_the_backends_collectives_in_order_with_their_sizes(counted):
    assert counted["direct"] == [["all_reduce", 3], ["broadcast", 2]]


def test_the_bucket_rebuild_runs_two_broadcasts_in_the_second_training_forward(counted):
    """find_unused_parameters=False: the reducer's rebuild (sync_bucket_indices) broadcasts
    the new bucket order (4 parameter indices and the bucket count: 5 elements), then the
    bucket sizes (1 bucket: 1 element), in the forward after the first iteration, once.
    Every backward all-reduces the one bucket (30 gradient elements)."""
    steps = counted["False"]
    assert [s["forward"] for s in steps] == [[], [["broadcast", 5], ["broadcast", 1]], []]
    assert all(s["backward"] == [["all_reduce", 30]] for s in steps), steps


def test_find_unused_parameters_adds_one_all_reduce_a_step_and_never_rebuilds(counted):
    """find_unused_parameters=True: no rebuild broadcast; every backward all-reduces the bucket
    and the map of used parameters (one entry a parameter: 4)."""
    steps = counted["True"]
    assert all(s["forward"] == [] for s in steps), steps
    # in flight together, on gloo's threads: either may start first
    assert all(sorted(s["backward"]) == [["all_reduce", 4], ["all_reduce", 30]]
               for s in steps), steps
