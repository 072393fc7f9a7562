"""The Part I exercise checks of data_parallel and costs: worked answers, shortcuts of different
kinds (known cheats included), other right answers (tests/check_cases.py)."""
import numpy as np
import torch
from check_cases import other, parametrize_cases, shortcut, worked

import helpers
from helpers import OPTIMIZER_STATE_BYTES


# ---- data_parallel -------------------------------------------------------------------------------
@worked("check_combine_mean_grads")
def combine_mean_grads(grads, sizes):
    return sum(g * n for g, n in zip(grads, sizes)) / sum(sizes)


@other("check_combine_mean_grads", "stacked, weights as a tensor")
def combine_mean_grads_stacked(grads, sizes):
    w = torch.tensor(sizes, dtype=torch.float32)
    return (torch.stack(grads) * w[:, None, None]).sum(0) / w.sum()


@other("check_combine_mean_grads", "in place, into the first shard's gradient (the exercise "
       "does not forbid it)")
def combine_mean_grads_in_place(grads, sizes):
    out = grads[0].mul_(sizes[0])
    for g, n in zip(grads[1:], sizes[1:]):
        out.add_(g, alpha=n)
    return out.div_(sum(sizes))


@shortcut("check_combine_mean_grads", "plain average, in place", "overweights the small shards")
def combine_mean_grads_average_in_place(grads, sizes):
    for g in grads[1:]:
        grads[0] += g
    return grads[0].div_(len(grads))


@shortcut("check_combine_mean_grads", "plain average", "overweights the small shards")
def combine_mean_grads_average(grads, sizes):
    return sum(grads) / len(grads)


@shortcut("check_combine_mean_grads", "plain sum", "you summed")
def combine_mean_grads_sum(grads, sizes):
    return sum(grads)


@worked("check_reduce_then_broadcast")
def reduce_then_broadcast(grads):
    total = sum(g.to(grads[0].device) for g in grads)
    for g in grads:
        g.copy_(total)


@other("check_reduce_then_broadcast", "accumulate into device 0's tensor, then copy")
def reduce_then_broadcast_inplace(grads):
    for g in grads[1:]:
        grads[0].add_(g.to(grads[0].device))
    for g in grads[1:]:
        g.copy_(grads[0])


@shortcut("check_reduce_then_broadcast", "no .to (crashes on GPUs)", "raises on real GPUs")
def reduce_then_broadcast_no_to(grads):
    total = sum(grads)
    for g in grads:
        g.copy_(total)


@shortcut("check_reduce_then_broadcast", "rebinds list items", "in place")
def reduce_then_broadcast_rebind(grads):
    total = sum(g.to(grads[0].device) for g in grads)
    for i in range(len(grads)):
        grads[i] = total.to(grads[i].device)


@shortcut("check_reduce_then_broadcast", "sums on the CPU, away from the devices", "raises")
def reduce_then_broadcast_cpu(grads):
    total = sum(g.cpu() for g in grads)
    for g in grads:
        g.copy_(total + g * 0)


@worked("check_bytes_sent_naive_vs_ring")
def bytes_sent(nbytes, k):
    return (k - 1) * nbytes, 2 * (k - 1) / k * nbytes


@other("check_bytes_sent_naive_vs_ring", "numpy, a list")
def bytes_sent_numpy(nbytes, k):
    return [np.int64(nbytes) * (k - 1), np.float64(nbytes) * 2 * (k - 1) / k]


@shortcut("check_bytes_sent_naive_vs_ring", "the reference", "course's own answer")
def bytes_sent_reference(nbytes, k):
    return (k - 1) * nbytes, helpers.ring_bytes_per_device(nbytes, k)


@shortcut("check_bytes_sent_naive_vs_ring", "counts receives too", "AND receives")
def bytes_sent_both_ways(nbytes, k):
    return 2 * (k - 1) * nbytes, 2 * (k - 1) / k * nbytes


@shortcut("check_bytes_sent_naive_vs_ring", "reduce-scatter only", "the reduce-scatter alone")
def bytes_sent_half_ring(nbytes, k):
    return (k - 1) * nbytes, (k - 1) / k * nbytes


# ---- costs ---------------------------------------------------------------------------------------
@worked("check_gpipe_time")
def gpipe_time(t_stage, p, m):
    return (m + p - 1) * t_stage / m


@other("check_gpipe_time", "per tick, numpy")
def gpipe_time_ticks(t_stage, p, m):
    return np.float64(t_stage) / m * (m + p - 1)


@shortcut("check_gpipe_time", "no division by m", "not the whole batch")
def gpipe_time_whole(t_stage, p, m):
    return (m + p - 1) * t_stage


@shortcut("check_gpipe_time", "no pipeline fill", "count the ticks")
def gpipe_time_no_fill(t_stage, p, m):
    return t_stage * p


@worked("check_largest_batch_data_parallel")
def largest_batch_data_parallel(sizes, k, memory_bytes, optimizer):
    P = sum(r["params"] for r in sizes)
    A = sum(r["acts"] for r in sizes)
    fixed = (8 + OPTIMIZER_STATE_BYTES[optimizer]) * P
    return k * max(0, (memory_bytes - fixed) // (4 * A))


@other("check_largest_batch_data_parallel", "a search, numpy")
def largest_batch_search(sizes, k, memory_bytes, optimizer):
    P = np.int64(sum(r["params"] for r in sizes))
    per = 4 * sum(r["acts"] for r in sizes)
    fixed = (8 + OPTIMIZER_STATE_BYTES[optimizer]) * P
    n = 0
    while fixed + (n + 1) * per <= memory_bytes:
        n += 1
    return n * k


@shortcut("check_largest_batch_data_parallel", "per device, not global", "multiply by k")
def largest_batch_per_device(sizes, k, memory_bytes, optimizer):
    return largest_batch_data_parallel(sizes, k, memory_bytes, optimizer) // k


@shortcut("check_largest_batch_data_parallel", "forgets the optimizer state", "keeps")
def largest_batch_no_state(sizes, k, memory_bytes, optimizer):
    P = sum(r["params"] for r in sizes)
    A = sum(r["acts"] for r in sizes)
    return k * max(0, (memory_bytes - 8 * P) // (4 * A))


@worked("check_saved_bytes")
def saved_bytes(net, X):
    params = {q.untyped_storage().data_ptr() for q in net.parameters()}
    seen, keep = {}, []

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
            keep.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(X)
    return sum(seen.values())


@other("check_saved_bytes", "storages kept in a list, compared by identity")
def saved_bytes_list(net, X):
    params = [q.untyped_storage() for q in net.parameters()]
    kept = []

    def pack(t):
        s = t.untyped_storage()
        if all(s.data_ptr() != p.data_ptr() for p in params + kept):
            kept.append(s)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(X)
    return np.int64(sum(s.nbytes() for s in kept))


@shortcut("check_saved_bytes", "the reference", "course's own answer")
def saved_bytes_reference(net, X):
    return sum(helpers.saved_per_layer(net, X))


@shortcut("check_saved_bytes", "parameters counted", "leave them out")
def saved_bytes_with_params(net, X):
    return saved_bytes(net, X) + sum(q.numel() * 4 for q in net.parameters())


@shortcut("check_saved_bytes", "layer outputs", "what the layers output")
def saved_bytes_outputs(net, X):
    total = []
    hooks = [m.register_forward_hook(lambda m, i, o: total.append(o.numel() * 4)) for m in net]
    with torch.no_grad():
        net(X)
    for h in hooks:
        h.remove()
    return sum(total)


test_case = parametrize_cases(__name__)
