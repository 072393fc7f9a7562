"""Shortcut families that apply to any exercise, one answer per way into each hole
(tests/check_cases.py's form): natural wrong answers, substituted collectives, work hidden in
another thread, constants (reading the check's state: tests/test_checks_frame_reads.py; the
course's own answer under another name: tests/test_checks_course_copies.py). Each must fail in
the harness; none of them is specific to the check it is tried on, and the right answers beside
them pass."""
import concurrent.futures
import threading

import torch
from check_cases import other, parametrize_cases, shortcut
from torch.nn import functional as F

import helpers


# ---- natural wrong answers -----------------------------------------------------------------------
@shortcut("check_allreduce_spread", "sums everything on the host", "the CPU")
def allreduce_spread_on_host(data):
    total = sum(t.to("cpu") for t in data)
    for t in data:
        t.copy_(total.to(t.device))


@shortcut("check_conv_split_in_channels", "splits the output pixels: unfold + mm",
          "partial sum")
def conv_split_pixels(X, W, b, devices, log=None):
    k, side = len(devices), X.shape[-1] - 2
    patches = F.unfold(X, 3)                                    # (n, c_in*9, L)
    Wf = W.reshape(W.shape[0], -1)
    parts = []
    for i, cols in enumerate(torch.arange(patches.shape[-1]).tensor_split(k)):
        P = patches[..., cols].to(devices[i])
        parts.append((Wf.to(devices[i]) @ P).to(devices[0]))
    Y = torch.cat(parts, dim=-1).reshape(X.shape[0], -1, side, side)
    return Y + b.to(devices[0]).reshape(1, -1, 1, 1)


@shortcut("check_conv_split_in_channels", "broadcast multiply on device 0 + decoy partial sums",
          "elements of work")
def conv_elementwise_decoys(X, W, b, devices, log=None):
    k, side = len(devices), X.shape[-1] - 2
    decoy = 0
    for i, (Xi, Wi) in enumerate(zip(X.tensor_split(k, dim=1), W.tensor_split(k, dim=1))):
        P = F.conv2d(Xi.to(devices[i]), Wi.to(devices[i]))
        decoy = decoy + P.to(devices[0]) * 0
    patches = F.unfold(X.to(devices[0]), 3)                     # (n, c_in*9, L)
    Wf = W.reshape(W.shape[0], -1).to(devices[0])
    Y = (patches[:, None] * Wf[None, :, :, None]).sum(2)        # (n, c_out, L), no matmul
    return Y.reshape(X.shape[0], -1, side, side) + b.to(devices[0]).reshape(1, -1, 1, 1) + decoy


@shortcut("check_overlap_hooks", "one all-reduce from a hook, the rest after backward",
          "launched after backward returned")
def overlap_hooks_one_early(model):
    import torch.distributed as dist
    trainable = [p for p in model.parameters() if p.requires_grad]
    handles, launched = [], set()

    def hook(p):
        if not launched:
            launched.add(id(p))
            handles.append(dist.all_reduce(p.grad, async_op=True))
    for p in trainable:
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for p in trainable:
            if id(p) not in launched:
                handles.append(dist.all_reduce(p.grad, async_op=True))
        for h in handles:
            h.wait()
        for p in trainable:
            p.grad.div_(dist.get_world_size())
    return finish


@shortcut("check_accumulate_zero2", "one concatenated batch, no accumulation",
          "concatenated batch")
def accumulate_zero2_concatenated(model, micro_batches):
    X = torch.cat([X for X, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    F.cross_entropy(model(X), y).backward()
    model.finish_gradient_synchronization()
    model.step()
    model.zero_grad()


@shortcut("check_accumulate_gradients", "zero-weight backwards, then the concatenated batch",
          "concatenated batch")
def accumulate_gradients_concatenated(model, loss_fn, micro_batches):
    for X, y in micro_batches[:-1]:
        with model.no_sync():
            (loss_fn(model(X), y) * 0).backward()
    X = torch.cat([X for X, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    loss_fn(model(X), y).backward()


# ---- substituted collectives ---------------------------------------------------------------------
def _gather_by_all_reduce(t, comm):
    """Every rank's t, gathered with all_reduce (a zero buffer with this rank's slot filled)."""
    w = comm.world
    buf = torch.zeros(w, *t.shape)
    buf[comm.rank] = t
    comm.all_reduce(buf)
    return buf


@shortcut("check_ring_forward", "all_reduce gather, zeros sent round the ring",
          "send and recv only")
def ring_forward_all_reduce(q, k, v, comm):
    w, r = comm.world, comm.rank
    K = torch.cat(list(_gather_by_all_reduce(k, comm)), 2)
    V = torch.cat(list(_gather_by_all_reduce(v, comm)), 2)
    for i in range(w - 1):
        comm.send(torch.zeros(2, *k.shape), (r + 1) % w, tag=i)
        comm.recv((r - 1) % w, (2, *k.shape), tag=i)
    comm.wait()
    return (q @ K.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1) @ V


@shortcut("check_ring_forward", "zeros of the right size round the ring", "stand-ins")
def ring_forward_zeros(q, k, v, comm):
    w, r = comm.world, comm.rank
    for i in range(w - 1):
        comm.send(torch.zeros(2, *k.shape), (r + 1) % w, tag=i)
        comm.recv((r - 1) % w, (2, *k.shape), tag=i)
    comm.wait()
    return torch.zeros_like(q)


@shortcut("check_ring_forward", "ring-forwarded all-gather, then plain softmax",
          "online softmax")
def ring_forward_gather_then_softmax(q, k, v, comm):
    w, r = comm.world, comm.rank
    kv, blocks = torch.stack([k, v]), {r: torch.stack([k, v])}
    for i in range(w - 1):
        comm.send(kv, (r + 1) % w, tag=i)
        kv = comm.recv((r - 1) % w, kv.shape, tag=i)
        blocks[(r - 1 - i) % w] = kv
    K = torch.cat([blocks[j][0] for j in range(w)], 2)
    V = torch.cat([blocks[j][1] for j in range(w)], 2)
    comm.wait()
    return (q @ K.transpose(-2, -1) / q.shape[-1] ** 0.5).softmax(-1) @ V


def _zeros_round(x, dest, comm):
    """Counts, then zero rows of the right count to every other rank (received, dropped)."""
    w, r = comm.world, comm.rank
    for j in range(w):
        if j != r:
            comm.send(torch.tensor([int((dest == j).sum())]), j, tag=7)
            comm.send(torch.zeros(int((dest == j).sum()), x.shape[1]), j, tag=8)
    for j in range(w):
        if j != r:
            n = int(comm.recv(j, (1,), tag=7, dtype=torch.int64))
            comm.recv(j, (n, x.shape[1]), tag=8)
    comm.wait()


@shortcut("check_dispatch_tokens", "all_reduce gather, zero rows of the right count",
          "send and recv only")
def dispatch_all_reduce(x, dest, comm):
    w, r = comm.world, comm.rank
    n = _gather_by_all_reduce(torch.tensor(float(len(x))), comm).long().tolist()
    pad = torch.zeros(max(n) - len(x), x.shape[1])
    rows = _gather_by_all_reduce(torch.cat([x, pad]), comm)
    dests = _gather_by_all_reduce(torch.cat([dest.float(), torch.full((len(pad),), -1.0)]), comm)
    _zeros_round(x, dest, comm)
    return torch.cat([rows[s][dests[s] == r] for s in range(w)])


@shortcut("check_dispatch_tokens", "zero rows of the right count", "stand-ins")
def dispatch_zeros(x, dest, comm):
    _zeros_round(x, dest, comm)
    return x[dest == comm.rank]


# ---- work in another thread ----------------------------------------------------------------------
@shortcut("check_shard_sizes", "torch.tensor_split in a worker thread", "split")
def shard_sizes_in_thread(n, k):
    out = []
    worker = threading.Thread(
        target=lambda: out.extend(len(s) for s in torch.arange(n).tensor_split(k)))
    worker.start()
    worker.join()
    return out


@shortcut("check_shard_sizes", "torch.tensor_split in a thread pool", "split")
def shard_sizes_in_pool(n, k):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: [len(s) for s in torch.arange(n).tensor_split(k)]).result()


_TABLE = {(n, k): [len(c) for c in torch.arange(n).chunk(k)]
          for n in range(1, 80) for k in range(2, 9)}


@shortcut("check_dp_shard_sizes", "torch.chunk in a worker thread", "built and cut")
def dp_shard_sizes_in_thread(n, k):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: [len(c) for c in torch.arange(n).chunk(k)]).result()


@shortcut("check_dp_shard_sizes", "a table built with torch.chunk at import", "expected")
def dp_shard_sizes_table(n, k):
    return _TABLE.get((n, k), [])


@shortcut("check_unused_parameters", "autograd.grad in a thread", "computed gradients")
def unused_parameters_in_thread(model, loss):
    names, params = zip(*model.named_parameters())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        grads = pool.submit(torch.autograd.grad, loss, params, allow_unused=True,
                            retain_graph=True).result()
    return sorted(n for n, gr in zip(names, grads) if gr is None)


# ---- constants -----------------------------------------------------------------------------------
@shortcut("check_time_it", "syncs correctly, returns a constant 6.5 ms", " ms")
def time_it_constant(fn, devices, reps=5):
    for _ in range(reps):
        helpers.synchronize(devices)
        fn()
        helpers.synchronize(devices)
    return 0.0065


@shortcut("check_time_it", "syncs correctly, returns a constant 20 ms", " ms")
def time_it_constant_20(fn, devices, reps=5):
    for _ in range(reps):
        helpers.synchronize(devices)
        fn()
        helpers.synchronize(devices)
    return 0.020


# ---- right answers pass --------------------------------------------------------------------------
@other("check_global_mean_var", "a pairwise (Chan) merge, rank by rank, float32")
def global_mean_var_chan(counts, means, variances):
    n, m, m2 = counts[0], means[0], variances[0] * counts[0]
    for i in range(1, len(counts)):
        nb, mb, m2b = counts[i], means[i], variances[i] * counts[i]
        delta, total = mb - m, n + nb
        m = m + delta * nb / total
        m2 = m2 + m2b + delta * delta * n * nb / total
        n = total
    return m, m2 / n


@other("check_bucket_params", "torch's dedupe order: first occurrence, then reversed")
def bucket_params_torch_order(params, bucket_mb):
    unique = []
    for p in params:
        if all(q is not p for q in unique):
            unique.append(p)
    limit = None if bucket_mb is None else bucket_mb * 2**20
    buckets, current, size = [], [], 0
    for p in reversed(unique):
        if not p.requires_grad:
            continue
        current.append(p)
        size += p.numel() * p.element_size()
        if limit is None or size >= limit:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


test_case = parametrize_cases(__name__)
