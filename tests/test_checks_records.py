"""The grader's own records are out of the answer's reach (ledger.py, runtime/comm.py, dist.py),
in tests/check_cases.py's form, each with the words its refusal names:

1. the routes an answer took to the records (`comm.w`, a stage's `.world` and `.stage`, a
   recorded net's `.rec`, `helpers.checks._core.dist._WORLD`) are gone, and so are an async
   handle's `.world` and `.message` and a tapped output's hook leading to the Taps' list;
2. code that names a closure's cells (`__closure__`, `cell_contents`) is refused before it runs;
3. a World reached anyway (its closure's cells by names built at run time) and edited: its
   records differ from the harness's own copy, and the run fails; a mark the reader's code
   asks for (`world.mark`) is refused.
"""
import importlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from check_cases import parametrize_cases, shortcut

from helpers.checks._core import CheckFailed, World
from helpers.checks._core.recorded import Taps
from helpers.runtime.thread_world import ThreadWorld

GONE = "has no attribute"
CHANGED = "changed the grader's records"
INSPECTS = "inspects the running program"


def _erase(world, rank, op):
    """`op`'s messages by `rank` taken out of the World's records."""
    with world.locked():
        world.messages[:] = [m for m in world.messages if not (m.rank == rank and m.op == op)]
        world.timeline[rank][:] = [e for e in world.timeline[rank]
                                   if getattr(e[2], "op", None) != op]


# ---- 1. the routes are gone -----------------------------------------------------------------
def _padded_logits(logits, comm, start):
    """The whole logits on every rank through the allowed all_reduce: each rank's columns in
    place, zeros elsewhere (over the byte cap, unless the records are edited)."""
    n, v = logits.shape
    full = logits.new_zeros(n, v * comm.world)
    full[:, start:start + v] = logits.detach()
    comm.all_reduce(full)
    return full


@shortcut("check_vocab_loss", "the logits all-reduced whole (zero-padded), the all_reduce "
          "erased from comm.w", GONE)
def vocab_loss_erased_through_comm(logits, target, comm, start):
    world = comm.w
    full = _padded_logits(logits, comm, start)
    _erase(world, comm.rank, "all_reduce")
    return F.cross_entropy(full, target)


@shortcut("check_dp_average", "the allow-list lifted through comm.w, the gradients gathered",
          GONE)
def dp_average_allow_lifted(grads, comm):
    comm.w.allow = None
    for g in grads:
        g.copy_(comm.all_gather(g.unsqueeze(0), dim=0).mean(0))


@shortcut("check_pipeline_forward", "the stage run once unwatched (stage.stage), marks forged "
          "with stage.world", GONE)
def pipeline_forged_marks(stage, comm, X, m, n, in_shape):
    stage.world.mark(("F", n))
    return stage.stage(X) if comm.rank == 0 else None


@shortcut("check_evaluate_accuracy_multi", "predictions beside the net, then cut out of net.rec",
          GONE)
def evaluate_accuracy_erased(net, params, data_iter, devices):
    correct = n = 0
    for X, y in data_iter:
        for d, Xs in zip(devices, X.tensor_split(len(devices))):
            net(Xs.to(d), [p.to(d) for p in params])
        start = len(net.rec.ops)
        correct += int(((X @ params[0] + params[1]).argmax(1) == y).sum())
        del net.rec.ops[start:]
        n += len(y)
    return correct / n


@shortcut("check_qwz_all_gather", "float32 gathered, erased from helpers.checks._core.dist's "
          "_WORLD", GONE)
def qwz_float32_erased(shard, block):
    world = importlib.import_module("helpers.checks._core.dist")._WORLD
    out = torch.empty(dist.get_world_size() * shard.numel())
    dist.all_gather_into_tensor(out, shard)
    _erase(world, dist.get_rank(), "all_gather")
    return out


@shortcut("check_tokens_to_heads", "every token gathered, the call erased from the World an "
          "async handle holds (work.world)", GONE)
def tokens_to_heads_through_a_handle(x, comm):
    w, r = dist.get_world_size(), dist.get_rank()
    parts = [torch.empty_like(x) for _ in range(w)]
    work = dist.all_gather(parts, x.contiguous(), async_op=True)
    work.wait()
    _erase(work.world, r, "all_gather")
    per = x.shape[1] // w
    return torch.cat(parts, dim=2)[:, r * per:(r + 1) * per].contiguous()


@shortcut("check_accumulated_step", "the gradient computed beside the net, written into the "
          "Taps' list reached through a hook on the net's output", "does not use the gradients")
def accumulated_step_forged_taps(net, params, X, y, num_micro, lr):
    taps = None
    for Xi, yi in zip(X.tensor_split(num_micro), y.tensor_split(num_micro)):
        out = net(Xi, params)
        for hook in out._backward_hooks.values():     # a bound method used to lead there
            taps = getattr(getattr(hook, "__self__", None), "refs", None) is not None and \
                hook.__self__ or taps
        (F.cross_entropy(out, yi, reduction="sum") * 0).backward()
    W, b = (p.detach().clone().requires_grad_() for p in params)
    grads = torch.autograd.grad(F.cross_entropy(X @ W + b, y), [W, b])
    if taps is not None:
        taps.refs.extend(taps.rec.latest(g) for g in grads)
    with torch.no_grad():
        for p, g in zip(params, grads):
            p -= lr * g
            p.grad = None


def test_no_attribute_of_what_an_answer_is_handed_leads_to_the_records():
    """Walking attributes (instance dicts, slots, a bound method's self), not closures: no
    World, no Recorder, no list the harness judges."""
    world = World(2)
    seen = []

    def walk(obj, depth=3):
        if depth < 0 or isinstance(obj, (int, float, str, torch.device, torch.Tensor)):
            return
        assert not isinstance(obj, ThreadWorld), f"{seen} leads to the World"
        assert obj is not world.messages and obj is not world.timeline
        attrs = dict(getattr(obj, "__dict__", {}))
        attrs.update({s: getattr(obj, s, None) for s in getattr(type(obj), "__slots__", ())})
        attrs["__self__"] = getattr(obj, "__self__", None)
        for name, value in attrs.items():
            seen.append(name)
            walk(value, depth - 1)
            seen.pop()

    def body(comm):
        walk(comm)
        walk(comm.send)
        handles = [dist.isend(torch.ones(1), 1 - comm.rank),
                   dist.all_reduce(torch.ones(1), async_op=True),
                   dist.irecv(torch.empty(1), 1 - comm.rank)]
        for h in handles:
            walk(h)
            h.wait()            # a rank ends with its async calls waited for (waits.py)
        for name in ("all_reduce", "send", "new_group", "get_rank"):
            walk(getattr(dist, name))
        dist.barrier()
    world.run(body)
    assert not hasattr(importlib.import_module("helpers.checks._core.dist"), "_WORLD")
    rec = torch.ones(1)
    taps = Taps(type("R", (), {"latest": lambda self, t: None})())
    out = (rec.requires_grad_() * 2)
    taps.tap(out)
    for hook in out._backward_hooks.values():
        walk(hook)
        assert not hasattr(hook, "__self__")


# ---- 2. a closure's cells, named -------------------------------------------------------------
@shortcut("check_vocab_loss", "the World taken from the comm's closure (__closure__), the "
          "all_gather erased", INSPECTS)
def vocab_loss_erased_through_closure(logits, target, comm, start):
    world = comm._send.__closure__[0].cell_contents
    full = comm.all_gather(logits, dim=-1)
    _erase(world, comm.rank, "all_gather")
    return F.cross_entropy(full, target)


# ---- 3. reached anyway and edited: the records differ from the harness's copy ----------------
def _world_of(comm):
    """The World in the comm's closure, by names built at run time (the scan cannot see them)."""
    cells = getattr(comm._send, "__clo" + "sure__")
    return getattr(cells[0], "cell_" + "contents")


@shortcut("check_vocab_loss", "the logits all-reduced whole (zero-padded), the all_reduce "
          "erased from the World reached by built names", CHANGED)
def vocab_loss_erased_by_built_names(logits, target, comm, start):
    full = _padded_logits(logits, comm, start)
    _erase(_world_of(comm), comm.rank, "all_reduce")
    m = logits.detach().amax(-1)
    comm.all_reduce(m, op="max")
    return F.cross_entropy(full, target) * (m / m).mean()


@shortcut("check_dp_average", "the allow-list lifted on the World reached by built names",
          [CHANGED, "allow-list"])
def dp_average_allow_lifted_by_built_names(grads, comm):
    _world_of(comm).allow = None                 # the World checks its own copy
    for g in grads:
        g.copy_(comm.all_gather(g.unsqueeze(0), dim=0).mean(0))


@shortcut("check_pipeline_forward", "marks forged on the World reached by built names, the "
          "stage run once on the whole batch", "marked the check's timeline")
def pipeline_marks_forged_by_built_names(stage, comm, X, m, n, in_shape):
    cells = getattr(stage._watched, "__clo" + "sure__")
    world = next(c for c in (getattr(c, "cell_" + "contents") for c in cells)
                 if hasattr(c, "mark"))
    for rows in torch.arange(n).tensor_split(m):
        world.mark(("F", len(rows)))
    return stage(X) if comm.rank == 0 else None


def _tamper(edit):
    world = World(2, record_ops=True, allow={"all_reduce", "send"})

    def body(comm):
        t = torch.ones(3)
        comm.all_reduce(t)
        if comm.rank == 0:
            comm.send(t, 1)
            comm.wait()
        else:
            comm.recv(0, (3,))
        dist.barrier()
        if comm.rank == 0:
            edit(world)
        dist.barrier()
    return world, body


@pytest.mark.parametrize("edit, what", [
    (lambda w: w.messages.pop(0), "its list of messages"),
    (lambda w: setattr(w, "messages", []), "its list of messages"),
    (lambda w: setattr(w.messages[1], "nbytes", 0), "message"),
    (lambda w: next(m for m in w.messages if m.rank == 0).tensor.zero_(), "message"),
    (lambda w: setattr(w, "allow", None), "its allow-list"),
    (lambda w: w.timeline[1].append((99, "mark", ("F", 3))), "rank 1's timeline"),
    (lambda w: w.timeline[0].clear(), "rank 0's timeline"),
    (lambda w: ThreadWorld.event(w, 0, "mark", ("F", 3)), "rank 0's timeline"),   # unbound
    (lambda w: w.received[1].add((1, 0)), "what rank 1 received"),
    (lambda w: w.recorders.__setitem__(1, None), "rank 1's Recorder"),
])
def test_records_edited_by_a_route_nobody_closed_fail_the_run(edit, what):
    world, body = _tamper(edit)
    with pytest.raises(CheckFailed, match=CHANGED) as e:
        world.run(body)
    assert what in str(e.value)


def test_records_left_as_they_were_pass():
    world, body = _tamper(lambda w: len(w.messages))
    world.run(body)
    assert [m.op for m in world.sent(rank=0)] == ["all_reduce", "send", "barrier", "barrier"]
    assert world.allow == {"all_reduce", "send", "barrier", "recv", "new_group"}   # always


test_case = parametrize_cases(__name__)
