"""Streams on the simulated GPUs of the placement checks (FakeGPUs, stream_races.py): work on two
streams runs independently, so an answer that reads what a side stream copied, or returns what
one wrote, without making its stream wait (wait_stream, wait_event, a synchronize) reads memory
that may not be written yet (gpus.ipynb, "Streams") and fails; the same answer with the wait
passes. A copy between two GPUs runs on the source's current stream, and only the stream then
current on the destination waits for it, as torch orders it. Host memory a non_blocking copy
still reads (to a GPU) or writes (to the host) is used only after a host wait for its stream."""
import copy

import torch
from check_cases import other, parametrize_cases, shortcut

from helpers.checks._core import FakeGPUs

WAIT = ["with no wait between them", "wait_stream(s)"]


def _side(d):
    d = torch.device(d)
    return torch.cuda.Stream(d) if d.type == "cuda" else None


def _current(d):
    d = torch.device(d)
    return torch.cuda.current_stream(d) if d.type == "cuda" else None


def _pieces_on_side_streams(X, devices):
    """X's pieces copied to their devices, each on a new stream of its device: (pieces,
    streams)."""
    pieces, streams = [], []
    for x, d in zip(X.chunk(len(devices)), devices, strict=True):
        streams.append(_side(d))
        with torch.cuda.stream(streams[-1]):
            pieces.append(x.to(d, non_blocking=True))
    return pieces, streams


@shortcut("check_dp_forward", "pieces copied on side streams, never waited for", WAIT)
def dp_forward_side_unwaited(net, X, devices):
    replicas = [copy.deepcopy(net).to(d) for d in devices]
    pieces, _ = _pieces_on_side_streams(X, devices)
    outs = [r(x) for r, x in zip(replicas, pieces, strict=True)]
    return torch.cat([o.to(devices[0]) for o in outs])


@other("check_dp_forward", "pieces copied on side streams, waited for (wait_stream)")
def dp_forward_side_waited(net, X, devices):
    replicas = [copy.deepcopy(net).to(d) for d in devices]
    pieces, streams = _pieces_on_side_streams(X, devices)
    outs = []
    for r, x, d, s in zip(replicas, pieces, devices, streams, strict=True):
        if s is not None:
            _current(d).wait_stream(s)
            x.record_stream(_current(d))
        outs.append(r(x))
    return torch.cat([o.to(devices[0]) for o in outs])


@shortcut("check_dp_forward", "outputs gathered on a side stream of devices[0], joined at once",
          WAIT)
def dp_forward_gather_side_unwaited(net, X, devices):
    replicas = [copy.deepcopy(net).to(d) for d in devices]
    outs = [r(x.to(d)) for r, x, d in zip(replicas, X.chunk(len(devices)), devices, strict=True)]
    with torch.cuda.stream(_side(devices[0])):
        moved = [o.to(devices[0], non_blocking=True) for o in outs]
    return torch.cat(moved)


def _pulled_on_side(grads):
    """The gradients of the other devices copied to grads[0]'s, on a new stream there."""
    s = _side(grads[0].device)
    with torch.cuda.stream(s):
        return s, [g.to(grads[0].device, non_blocking=True) for g in grads[1:]]


@shortcut("check_reduce_then_broadcast", "gradients pulled on a side stream, added at once", WAIT)
def reduce_then_broadcast_side_unwaited(grads):
    _, moved = _pulled_on_side(grads)
    total = grads[0].clone()
    for m in moved:
        total.add_(m)
    for g in grads:
        g.copy_(total)


@other("check_reduce_then_broadcast", "gradients pulled on a side stream, waited for")
def reduce_then_broadcast_side_waited(grads):
    s, moved = _pulled_on_side(grads)
    if s is not None:
        _current(grads[0].device).wait_stream(s)
    total = grads[0].clone()
    for m in moved:
        total.add_(m)
    for g in grads:
        g.copy_(total)


@shortcut("check_reduce_then_broadcast", "the sum copied out on each other device's side stream, "
          "returned without waiting", ["returned", "never waited for it", "wait_stream(s)"])
def reduce_then_broadcast_returns_unwaited(grads):
    total = sum(g.to(grads[0].device) for g in grads)
    grads[0].copy_(total)
    for g in grads[1:]:
        with torch.cuda.stream(_side(g.device)):
            g.copy_(total, non_blocking=True)


def _spread_on_side(data, wait):
    """allreduce_spread with each chunk's pieces fetched on a new stream of its owner; `wait`:
    an event recorded there that the current stream waits on before adding."""
    k = len(data)
    chunks = [t.view(-1).tensor_split(k) for t in data]
    for i in range(k):
        own = chunks[i][i]
        s = _side(own.device)
        with torch.cuda.stream(s):
            got = [chunks[j][i].to(own.device, non_blocking=True) for j in range(k) if j != i]
        if wait and s is not None:
            _current(own.device).wait_event(s.record_event())
        for x in got:
            own.add_(x)
    for i in range(k):
        for j in range(k):
            if j != i:
                chunks[j][i].copy_(chunks[i][i])


@shortcut("check_allreduce_spread", "pieces fetched on side streams, added at once", WAIT)
def allreduce_spread_side_unwaited(data):
    _spread_on_side(data, wait=False)


@other("check_allreduce_spread", "pieces fetched on side streams, an event waited on")
def allreduce_spread_side_waited(data):
    _spread_on_side(data, wait=True)


# One pinned staging buffer reused for every device: a non_blocking copy from pinned memory
# returns before it runs, so the next piece written into the buffer may be what a GPU receives
# (PyTorch's pin_memory/non_blocking tutorial), unless the host waits for the copy first.
PINNED = ["pinned host memory", "may still be reading", ".synchronize()"]


def _staged(net, X, devices, write, wait=None, pin=True, non_blocking=True, per_device=False):
    """dp_forward with X's pieces staged through host buffers: `write(buf, x)` fills one,
    `wait(d, stream)` runs after each piece's copy to its device `d`."""
    replicas = [copy.deepcopy(net).to(d) for d in devices]
    pieces = X.chunk(len(devices))

    def buffer():
        b = torch.empty(pieces[0].shape, dtype=X.dtype)
        return b.pin_memory() if pin else b

    stage, outs = buffer(), []
    for r, x, d in zip(replicas, pieces, devices, strict=True):
        buf = (buffer() if per_device else stage)[:len(x)]
        write(buf, x)
        xd = buf.to(d, non_blocking=non_blocking)
        if wait is not None and torch.device(d).type == "cuda":
            wait(d, _current(d))
        outs.append(r(xd))
    return torch.cat([o.to(devices[0]) for o in outs])


def _copy_in(buf, x):
    buf.copy_(x)


@shortcut("check_dp_forward", "one pinned staging buffer rewritten before its non_blocking "
          "copy was waited for", PINNED)
def dp_forward_pinned_staging_reused(net, X, devices):
    return _staged(net, X, devices, _copy_in)


@shortcut("check_dp_forward", "the batch on the host, one pinned buffer refilled in place",
          PINNED + ["(copy_, on the host)"])
def dp_forward_pinned_staging_refilled_on_host(net, X, devices):
    return _staged(net, X.cpu(), devices, _copy_in)


@shortcut("check_dp_forward", "one pinned buffer refilled with out=", PINNED + ["(add, "])
def dp_forward_pinned_staging_out(net, X, devices):
    return _staged(net, X.cpu(), devices, lambda buf, x: torch.add(x, 0, out=buf))


@shortcut("check_dp_forward", "a pinned buffer reused after a wait of the GPU's stream only "
          "(wait_event), not of the host", PINNED + ["not the host"])
def dp_forward_pinned_staging_stream_waits(net, X, devices):
    def gpu_side(d, s):
        s.wait_event(s.record_event())
    return _staged(net, X, devices, _copy_in, gpu_side)


@other("check_dp_forward", "one pinned staging buffer, the host waits for each copy")
def dp_forward_pinned_staging_synced(net, X, devices):
    return _staged(net, X, devices, _copy_in, lambda d, s: s.synchronize())


@other("check_dp_forward", "one pinned staging buffer, an event's synchronize between reuses")
def dp_forward_pinned_staging_event(net, X, devices):
    return _staged(net, X.cpu(), devices, _copy_in, lambda d, s: s.record_event().synchronize())


@other("check_dp_forward", "a pinned staging buffer per device")
def dp_forward_pinned_staging_per_device(net, X, devices):
    return _staged(net, X.cpu(), devices, _copy_in, per_device=True)


@other("check_dp_forward", "one pageable staging buffer, non_blocking")
def dp_forward_pageable_staging_reused(net, X, devices):
    return _staged(net, X.cpu(), devices, _copy_in, pin=False)


@other("check_dp_forward", "one pinned staging buffer, blocking copies")
def dp_forward_pinned_staging_blocking(net, X, devices):
    return _staged(net, X, devices, _copy_in, non_blocking=False)


# A copy to the host with non_blocking=True lands in pinned memory (torch pins the result of
# `.to("cpu", non_blocking=True)`) and returns before it runs, so the host reads what it holds
# only after a wait for the copy's stream (PyTorch's pin_memory/non_blocking tutorial).
LANDING = ["non_blocking copy to the host", "may still be writing", ".synchronize()"]


def _counted(net, params, data_iter, devices):
    """evaluate_accuracy_multi's counts of correct predictions, one tensor per device, and the
    examples seen."""
    replicas = [[p.to(d, copy=True) for p in params] for d in devices]
    correct = [torch.zeros((), dtype=torch.long, device=d) for d in devices]
    total = 0
    with torch.no_grad():
        for X, y in data_iter:
            k = len(devices)
            for i, (W, Xs, ys, d) in enumerate(zip(replicas, X.tensor_split(k),
                                                   y.tensor_split(k), devices, strict=True)):
                correct[i] += (net(Xs.to(d), W).argmax(dim=1) == ys.to(d)).sum()
            total += y.numel()
    return correct, total


def _sync(devices):
    for d in devices:
        if torch.device(d).type == "cuda":
            torch.cuda.synchronize(d)


@shortcut("check_evaluate_accuracy_multi", "counts copied to the host non_blocking, each read "
          "at once (.item())", LANDING + ["(.item(), float()"])
def evaluate_accuracy_multi_landing_item(net, params, data_iter, devices):
    correct, total = _counted(net, params, data_iter, devices)
    return sum(c.to("cpu", non_blocking=True).item() for c in correct) / total


@shortcut("check_evaluate_accuracy_multi", "counts copied to the host non_blocking, added there "
          "at once", LANDING + ["(stack, on the host)"])
def evaluate_accuracy_multi_landing_stacked(net, params, data_iter, devices):
    correct, total = _counted(net, params, data_iter, devices)
    got = torch.stack([c.to("cpu", non_blocking=True) for c in correct])
    return got.sum().item() / total


@shortcut("check_evaluate_accuracy_multi", "the accuracy returned as a tensor copied to the host "
          "non_blocking", ["returned", "non_blocking copy to the host", ".synchronize()"])
def evaluate_accuracy_multi_landing_returned(net, params, data_iter, devices):
    correct, total = _counted(net, params, data_iter, devices)
    return (sum(c.to(devices[0]) for c in correct) / total).to("cpu", non_blocking=True)


@other("check_evaluate_accuracy_multi", "counts copied to the host non_blocking, every device "
       "synchronized before reading")
def evaluate_accuracy_multi_landing_synced(net, params, data_iter, devices):
    correct, total = _counted(net, params, data_iter, devices)
    got = [c.to("cpu", non_blocking=True) for c in correct]
    _sync(devices)
    return sum(c.item() for c in got) / total


@other("check_evaluate_accuracy_multi", "counts copied non_blocking into a pinned buffer, an "
       "event per device synchronized before reading")
def evaluate_accuracy_multi_landing_events(net, params, data_iter, devices):
    correct, total = _counted(net, params, data_iter, devices)
    got = torch.empty(len(devices), dtype=torch.long).pin_memory()
    done = []
    for i, (c, d) in enumerate(zip(correct, devices, strict=True)):
        got[i].copy_(c, non_blocking=True)
        if torch.device(d).type == "cuda":
            done.append(torch.cuda.current_stream(d).record_event())
    for e in done:
        e.synchronize()
    return got.sum().item() / total


@other("check_evaluate_accuracy_multi", "counts copied non_blocking into pageable memory (such "
       "a copy returns once it is done)")
def evaluate_accuracy_multi_landing_pageable(net, params, data_iter, devices):
    correct, total = _counted(net, params, data_iter, devices)
    got = torch.empty(len(devices), dtype=torch.long)
    for i, c in enumerate(correct):
        got[i].copy_(c, non_blocking=True)
    return got.sum().item() / total


@other("check_evaluate_accuracy_multi", "a count read with .item() on its GPU after its "
       "non_blocking copy on the same stream (.item() waits for that stream)")
def evaluate_accuracy_multi_landing_item_waits(net, params, data_iter, devices):
    correct, total = _counted(net, params, data_iter, devices)
    got = []
    for c in correct:
        got.append(c.to("cpu", non_blocking=True))
        c.item()
    return sum(g.item() for g in got) / total


@shortcut("check_reduce_then_broadcast", "gradients copied to the host non_blocking, summed "
          "there at once", LANDING + ["(add, on the host)"])
def reduce_then_broadcast_host_landing(grads):
    total = sum(g.to("cpu", non_blocking=True) for g in grads)
    for g in grads:
        g.copy_(total)


@other("check_reduce_then_broadcast", "gradients copied to the host non_blocking, every device "
       "synchronized before summing")
def reduce_then_broadcast_host_landing_synced(grads):
    moved = [g.to("cpu", non_blocking=True) for g in grads]
    _sync([g.device for g in grads])
    total = sum(moved)
    for g in grads:
        g.copy_(total)


test_case = parametrize_cases(__name__)


def test_the_streams_of_the_simulated_gpus():
    """current_stream is the device's default stream until one is made current (per device, and
    put back after the block); a new Stream is another stream."""
    with FakeGPUs(2).active():
        d = torch.device("cuda", 1)
        assert torch.cuda.current_stream(d) == torch.cuda.default_stream(d)
        side = torch.cuda.Stream(d)
        assert side != torch.cuda.default_stream(d)
        with torch.cuda.stream(side):
            assert torch.cuda.current_device() == 1
            assert torch.cuda.current_stream() == side
            assert torch.cuda.current_stream(0) == torch.cuda.default_stream(0)
        assert torch.cuda.current_stream(d) == torch.cuda.default_stream(d)
        assert torch.cuda.current_device() == 0


def test_every_host_read_of_a_copy_to_the_host_waits_for_its_stream():
    """Each way the host reads what a non_blocking copy to the host wrote (an operation, a value
    read out past the dispatcher) fails before the host waited for the copy's stream, names the
    wait, and passes after any host wait for it; a wait for another GPU, or a GPU-side wait, is
    none."""
    import numpy as np

    from helpers.checks._core import CheckFailed

    reads = {"op": lambda y: y * 2, "item": lambda y: y.sum().item(),
             "float": lambda y: float(y[0]), "tolist": lambda y: y.tolist(),
             "numpy": lambda y: y.numpy(), "asarray": lambda y: np.asarray(y),
             "equal": lambda y: torch.equal(y, y)}
    waits = {"synchronize": lambda: torch.cuda.synchronize(1),
             "stream": lambda: torch.cuda.current_stream(1).synchronize(),
             "event": lambda: torch.cuda.current_stream(1).record_event().synchronize(),
             "query": lambda: torch.cuda.current_stream(1).query(),
             "blocking copy": lambda: torch.zeros(1, device="cuda:1").cpu()}
    none = {"nothing": lambda: None, "another GPU": lambda: torch.cuda.synchronize(0),
            "a GPU-side wait": lambda: torch.cuda.current_stream(0).wait_stream(
                torch.cuda.current_stream(1))}
    for (read_name, read), (wait_name, wait) in [(r, w) for r in reads.items()
                                                 for w in {**waits, **none}.items()]:
        gpus = FakeGPUs(2)
        x = gpus.tensor(torch.randn(3), 1)

        def answer(x, read=read, wait=wait):
            y = x.to("cpu", non_blocking=True)
            wait()
            read(y)
        try:
            gpus.run(answer, x)
        except CheckFailed as e:
            assert wait_name in none, f"{read_name} after {wait_name}: {e}"
            assert "may still be writing" in str(e) and "cuda:1" in str(e), str(e)
            assert 'torch.cuda.current_stream("cuda:1").synchronize()' in str(e), str(e)
        else:
            assert wait_name in waits, f"{read_name} after {wait_name} passed"
