"""An `out=` argument is written once and never read (helpers/checks/_core/written.py): the
Recorder counts `torch.add(a, b, out=a)` as the one in-place addition it is (not two writes, so
not twice the additions), and an out= into a slice of a scratch buffer holds only what the
operation wrote there, whatever the buffer held before; so does a tensor reset by
`torch._foreach_zero_` (what an optimizer's zero_grad(set_to_none=False) runs) (tests/
check_cases.py)."""
import torch
from check_cases import other, parametrize_cases, shortcut

import helpers
from helpers import unflatten_into


def _spread(data, add):
    k = len(data)
    chunks = [t.view(-1).tensor_split(k) for t in data]
    for i in range(k):
        for j in range(k):
            if j != i:
                add(chunks[i][i], chunks[j][i].to(chunks[i][i].device))
    for i in range(k):
        for j in range(k):
            if j != i:
                chunks[j][i].copy_(chunks[i][i])


@other("check_allreduce_spread", "each chunk summed in place by torch.add(out=)")
def allreduce_spread_add_out(data):
    _spread(data, lambda a, b: torch.add(a, b, out=a))


@shortcut("check_allreduce_spread", "every addition on device 0, by torch.add(out=)",
          "spread them")
def allreduce_spread_add_out_on_device0(data):
    total = data[0]
    for t in data[1:]:
        torch.add(total, t.to(total.device), out=total)
    for t in data[1:]:
        t.copy_(total)


def _ring(data, add):
    k = len(data)
    chunks = [list(t.view(-1).tensor_split(k)) for t in data]
    sent = [0] * k
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(k - 1):
            for i in range(k):
                dst = (i + 1) % k
                c = (i - s) % k if phase == "reduce-scatter" else (i + 1 - s) % k
                if phase == "reduce-scatter":
                    add(chunks[dst][c], chunks[i][c].to(data[dst].device))
                else:
                    chunks[dst][c].copy_(chunks[i][c])
                sent[i] += chunks[i][c].numel()
    return sent


@other("check_ring_allreduce", "the received chunk added by torch.add(received, own, out=own)")
def ring_allreduce_add_out(data):
    return _ring(data, lambda own, got: torch.add(got, own, out=own))


@other("check_reduce_then_broadcast", "summed into device 0's by torch.add(out=)")
def reduce_then_broadcast_add_out(grads):
    for g in grads[1:]:
        torch.add(grads[0], g.to(grads[0].device), out=grads[0])
    for g in grads[1:]:
        g.copy_(grads[0])


@shortcut("check_reduce_then_broadcast", "every device sums all itself, by torch.add(out=)",
          "rather than every device summing them for itself")
def reduce_then_broadcast_add_out_everywhere(grads):
    copies = [[g.to(mine.device, copy=True) for g in grads] for mine in grads]
    for mine, got in zip(grads, copies, strict=True):
        total = got[0].clone()
        for g in got[1:]:
            torch.add(total, g, out=total)
        mine.copy_(total)


@other("check_sharded_server_step", "the server sums by torch.add(out=), steps by torch.sub(out=)")
def sharded_server_step_out(params, grads, devices, lr):
    k = len(devices)
    pc, gc = [p.tensor_split(k) for p in params], [g.tensor_split(k) for g in grads]
    for j in range(k):
        total = gc[j][j].clone()
        for i in range(k):
            if i != j:
                torch.add(total, gc[i][j].to(devices[j]), out=total)
        torch.sub(pc[j][j], total, alpha=lr, out=pc[j][j])
    for i in range(k):
        for j in range(k):
            if i != j:
                pc[i][j].copy_(pc[j][j])


def _bucket_ranges(grads, bucket_bytes):
    bucket, size = [], 0
    for i, g in enumerate(grads[0]):
        bucket.append(i)
        size += g.numel() * g.element_size()
        if size >= bucket_bytes or i == len(grads[0]) - 1:
            yield bucket, sum(grads[0][j].numel() for j in bucket)
            bucket, size = [], 0


def _scratch_allreduce(grads, bucket_bytes, sent):
    """One scratch buffer per replica, reused bucket after bucket: each bucket's tensors put in
    its first n elements by torch.cat(out=); `sent(buf, n, at)` is the part of it sent."""
    bufs = [r[0].new_empty(sum(t.numel() for t in r)) for r in grads]
    at = 0
    for b, n in _bucket_ranges(grads, bucket_bytes):
        for buf, r in zip(bufs, grads, strict=True):
            torch.cat([r[j].reshape(-1) for j in b], out=sent(buf, n, at)[-n:])
        acc = sent(bufs[0], n, at)
        for buf in bufs[1:]:
            acc.add_(sent(buf, n, at).to(acc.device))
        for buf, r in zip(bufs, grads, strict=True):
            sent(buf, n, at).copy_(acc.to(buf.device))
            unflatten_into(sent(buf, n, at)[-n:], [r[j] for j in b])
        at += n


@other("check_bucket_allreduce", "one scratch buffer reused, filled by torch.cat(out=buf[:n])")
def bucket_allreduce_scratch_cat_out(grads, bucket_bytes):
    _scratch_allreduce(grads, bucket_bytes, lambda buf, n, at: buf[:n])


@shortcut("check_bucket_allreduce", "each bucket cat(out=) after the last, all so far sent",
          [("parts of", "one buffer of all")])
def bucket_allreduce_scratch_all_so_far(grads, bucket_bytes):
    _scratch_allreduce(grads, bucket_bytes, lambda buf, n, at: buf[:at + n])


@other("check_bucket_allreduce", "one scratch buffer reused, reset by torch._foreach_zero_ and "
       "summed into")
def bucket_allreduce_scratch_foreach_zero(grads, bucket_bytes):
    bufs = [r[0].new_empty(sum(t.numel() for t in r)) for r in grads]
    for b, n in _bucket_ranges(grads, bucket_bytes):
        torch._foreach_zero_(bufs)          # overwrites each, reads none: nothing of before
        for buf, r in zip(bufs, grads, strict=True):
            buf[:n].add_(torch.cat([r[j].reshape(-1) for j in b]))
        acc = bufs[0][:n]
        for buf in bufs[1:]:
            acc.add_(buf[:n].to(acc.device))
        for buf, r in zip(bufs, grads, strict=True):
            buf[:n].copy_(acc.to(buf.device))
            unflatten_into(buf[:n], [r[j] for j in b])


@other("check_accumulated_step", "gradients cleared first by an optimizer's "
       "zero_grad(set_to_none=False), foreach")
def accumulated_step_optimizer_zero_grad(net, params, X, y, num_micro, lr):
    torch.optim.SGD(params, lr=lr, foreach=True).zero_grad(set_to_none=False)
    for X_m, y_m in zip(X.tensor_split(num_micro), y.tensor_split(num_micro), strict=True):
        helpers.loss(net(X_m, params), y_m).sum().backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad / X.shape[0]


test_case = parametrize_cases(__name__)


# ---- the Recorder itself ------------------------------------------------------------------------
def test_an_out_argument_that_is_also_an_operand_is_one_write_whose_old_values_flow():
    from helpers.checks._core import Recorder
    with Recorder() as rec:
        a, b = torch.ones(4), torch.ones(4)
        before = rec.latest(a)
        torch.add(a, b, out=a)
        torch.add(b, a, alpha=2, out=a)
    adds = rec.named("add")
    assert [len(op.writes) for op in adds] == [1, 1]
    assert sum(op.adds for op in adds) == 8
    assert rec.latest(a)[1] == before[1] + 2
    assert rec.depends_on([a], [before])        # `a` as an operand is read, whole as it is


def test_an_out_slice_holds_what_was_written_there_only():
    from helpers.checks._core.flow import follow
    from helpers.checks._core.observe import Recorder
    x, y = torch.ones(6), torch.ones(2)
    with Recorder() as rec:
        buf = torch.empty(8)
        torch.cat([x[:3], x[3:]], out=buf[:6])
        torch.cat([y, y], out=buf[:4])
        buf[:4].to("meta")
        buf[:8].to("meta")
    first, second = [names for _, _, names, _, _ in follow(rec, {"x": x, "y": y})]
    assert set(first) == {"y"}                  # x's data was overwritten in that range
    assert second.get("x", 0) == 2 and second["y"] == 4
