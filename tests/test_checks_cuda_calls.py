"""torch.cuda's device, stream and event calls change no value: on the simulated GPUs they
stand in (cuda_calls.py), so right answers that use them pass, as torch's parallel_apply
(a device and a stream context per replica) would, and values still flow through the devices.
pin_memory() in a check's CPU phase, on a machine without CUDA, copies to the host as on a GPU
grader (host_pin.py), so pinning host batches is no error here."""
import copy
import threading

import torch
from check_cases import other, parametrize_cases, shortcut

import helpers.checks


def _cuda(d):
    return torch.device(d).type == "cuda"


@other("check_dp_forward", "each replica under its device and a side stream, joined")
def dp_forward_device_streams(net, X, devices):
    outs = []
    for x, d in zip(X.chunk(len(devices)), devices):
        replica = copy.deepcopy(net).to(d)
        if _cuda(d):
            assert torch.device(d).index < torch.cuda.device_count(), "no such GPU"
            torch.cuda.get_device_name(d)
            with torch.cuda.device(d):
                s = torch.cuda.Stream(device=d)
                s.wait_stream(torch.cuda.current_stream(d))
                with torch.cuda.stream(s):
                    outs.append(replica(x.cpu().pin_memory().to(d, non_blocking=True)))
                torch.cuda.current_stream(d).wait_stream(s)
        else:
            outs.append(replica(x.to(d)))
    return torch.cat([o.to(devices[0]) for o in outs])


@other("check_dp_forward", "threads, each setting its device (parallel_apply's style)")
def dp_forward_threads_set_device(net, X, devices):
    pieces, outs = X.chunk(len(devices)), [None] * len(devices)

    def work(i):
        if _cuda(devices[i]):
            torch.cuda.set_device(devices[i])
        outs[i] = copy.deepcopy(net).to(devices[i])(pieces[i].to(devices[i]))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(pieces))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return torch.cat([o.to(devices[0]) for o in outs])


@other("check_reduce_then_broadcast", "events and record_stream mark the sum's use")
def reduce_then_broadcast_events(grads):
    d0 = grads[0].device
    total = grads[0].clone()
    for g in grads[1:]:
        moved = g.to(d0, non_blocking=True)
        if moved.is_cuda:
            moved.record_stream(torch.cuda.current_stream(d0))
        total += moved
    if d0.type == "cuda":
        start, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        done.record(torch.cuda.current_stream(d0))
        done.synchronize()
        start.elapsed_time(done)
        generic = torch.Event(device=d0)
        generic.record()
        generic.synchronize()
    for g in grads:
        g.copy_(total, non_blocking=True)
    for g in grads:
        if g.is_cuda:
            torch.cuda.current_stream(g.device).synchronize()


@shortcut("check_reduce_then_broadcast", "summed across devices under a device context",
          ("raises on real GPUs",))
def reduce_then_broadcast_events_unmoved(grads):
    total = grads[0].clone()
    for g in grads[1:]:
        if g.is_cuda:
            with torch.cuda.device(g.device):
                total += g
        else:
            total += g
    for g in grads:
        g.copy_(total)


@other("check_dp_forward", "a pinned host copy of a batch on the host, copied non_blocking")
def dp_forward_pinned_batch(net, X, devices):
    replicas = [copy.deepcopy(net).to(d) for d in devices]
    src = X.pin_memory() if X.device.type == "cpu" else X     # as on a GPU grader, anywhere
    assert X.device.type != "cpu" or src.is_pinned(), "pin_memory() pinned nothing"
    pieces = src.chunk(len(devices))
    outs = [r(x.to(d, non_blocking=True)) for r, x, d in zip(replicas, pieces, devices)]
    return torch.cat([o.to(devices[0]) for o in outs])


@other("check_evaluate_accuracy_multi", "pinned host batches, shards copied non_blocking")
def evaluate_accuracy_multi_pinned(net, params, data_iter, devices):
    replicas = [[p.to(d, copy=True) for p in params] for d in devices]
    correct, total = 0, 0
    with torch.no_grad():
        for X, y in data_iter:
            X, y = X.pin_memory(), y.pin_memory()
            k = len(devices)
            for W, Xs, ys, d in zip(replicas, X.tensor_split(k), y.tensor_split(k), devices):
                Xs, ys = Xs.to(d, non_blocking=True), ys.to(d, non_blocking=True)
                correct += int((net(Xs, W).argmax(dim=1) == ys).sum())
            total += y.numel()
    return correct / total


test_case = parametrize_cases(__name__)


def test_a_call_not_stood_in_is_named_never_blamed_on_the_machine():
    """A torch.cuda call the simulation lacks is named as the grader's limit; never "run this
    check on a machine with no GPU" (which this machine may be)."""
    def answer(grads):
        if grads[0].is_cuda:
            torch.cuda.mem_get_info(grads[0].device)
        total = sum(g.to(grads[0].device) for g in grads)
        for g in grads:
            g.copy_(total)
    result = helpers.checks.check_reduce_then_broadcast(answer)
    assert result.status == "error", result
    assert "torch.cuda" in result.message and "mem_get_info" in result.message, result.message
    assert "no GPU" not in result.message, result.message
