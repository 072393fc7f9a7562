"""Shortcut answers that step outside what the checks watch fail (tests/check_cases.py's form):
work done in another process (forked, or a fresh interpreter that imports the course again),
torch's dispatch switched off around the work (the Recorder and the ranks' ownership watch
through it), a returned tensor of the answer's own subclass that answers the check's comparisons
itself, memory the ranks share outside torch (a module-level numpy array or bytearray that every
rank wraps), an input the check handed to one rank read by another through a global, and shard
sizes measured on numpy arrays where the check refuses the same work in torch. Right answers
(host-made buffers moved to the devices, each rank's own numpy buffer, constants made before the
run, sizes from numpy's integer scalars used as numbers) pass (helpers/checks/_core/guard.py,
references.py, provenance.py and numpy_work.py)."""
import concurrent.futures
import multiprocessing as mp

import numpy as np
import torch
import torch.distributed as dist
from check_cases import dp_peers, other, parametrize_cases, shortcut
from numpy import diff as _diff_bound_before
from torch.utils._python_dispatch import _disable_current_modes

PROCESS = "starts another process"
DISPATCH = "switches off torch's dispatch"
OUTSIDE = "outside torch"
HANDED = "the check handed to rank"
NUMPY = ["numpy arrays", "with arithmetic"]


# ---- another process ---------------------------------------------------------------------------
def _grads_none(model, loss, q):
    names = [n for n, _ in model.named_parameters()]
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    q.put(sorted(n for n, g in zip(names, grads, strict=True) if g is None))


@shortcut("check_unused_parameters", "autograd.grad in a forked child", PROCESS)
def unused_parameters_forked(model, loss):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_grads_none, args=(model, loss, q))
    p.start()
    out = q.get()
    p.join()
    return out


def _course_order(p, m):
    import importlib
    return getattr(importlib.import_module("helpers"), "one_f_one_b_" + "order")(p, m)


@shortcut("check_order_1f1b", "the course's order from a fresh interpreter", PROCESS)
def order_1f1b_spawned(p, m):
    ctx = mp.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        return pool.submit(_course_order, p, m).result()


# ---- dispatch switched off ---------------------------------------------------------------------
@shortcut("check_shard_sizes", "tensor_split under _DisableTorchDispatch", DISPATCH)
def shard_sizes_no_dispatch(n, k):
    with torch._C._DisableTorchDispatch():
        return [len(s) for s in torch.arange(n).tensor_split(k)]


@shortcut("check_shard_sizes", "tensor_split with the Python key excluded", DISPATCH)
def shard_sizes_exclude_python_key(n, k):
    keys = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
    with torch._C._ExcludeDispatchKeyGuard(keys):
        return [len(s) for s in torch.arange(n).tensor_split(k)]


_POST = {}


@shortcut("check_dp_average", "other ranks' gradients read with the modes set aside", DISPATCH)
def dp_average_modes_off(grads, comm):
    _POST[dist.get_rank()] = grads
    comm.all_reduce(torch.zeros(1))
    with _disable_current_modes():
        means = [torch.stack([_POST[r][i] for r in dp_peers(comm)]).mean(0)
                 for i in range(len(grads))]
    comm.all_reduce(torch.zeros(1))
    with _disable_current_modes():
        for g, m in zip(grads, means, strict=True):
            g.copy_(m)


# ---- a returned tensor that agrees with anything ----------------------------------------------
class _Agreeable(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.equal, torch.allclose, torch.Tensor.equal, torch.Tensor.allclose):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})


@shortcut("check_combine_mean_grads", "zeros that compare close to anything", "subclass")
def combine_mean_grads_agreeable(grads, sizes):
    return torch.zeros_like(grads[0]).as_subclass(_Agreeable)


@shortcut("check_tokens_to_heads", "zeros sent, a result that compares equal", "subclass")
def tokens_to_heads_agreeable(x, comm):
    w, r = comm.world, comm.rank
    pieces = x.chunk(w, dim=1)
    for j in range(w):
        if j != r:
            comm.send(torch.zeros_like(pieces[j]), j)
    for j in range(w):
        if j != r:
            comm.recv(j, tuple(pieces[j].shape))
    B, H, t, D = x.shape
    return torch.zeros(B, H // w, t * w, D).as_subclass(_Agreeable)


# ---- a right answer: receive buffers made on the host, then moved -------------------------------
@other("check_ring_allreduce")
def ring_allreduce_host_buffers(data):
    k = len(data)
    flat = [t.view(-1) for t in data]
    chunks = [f.tensor_split(k) for f in flat]
    sent = [0] * k
    for step in range(k - 1):                  # reduce-scatter
        moved = []
        for i in range(k):
            c, dst = (i - step) % k, (i + 1) % k
            buf = torch.zeros(chunks[i][c].shape).to(flat[dst].device)
            buf.copy_(chunks[i][c])
            moved.append((dst, c, buf))
            sent[i] += chunks[i][c].numel()
        for dst, c, buf in moved:
            chunks[dst][c].add_(buf)
    for step in range(k - 1):                  # all-gather
        moved = []
        for i in range(k):
            c, dst = (i + 1 - step) % k, (i + 1) % k
            moved.append((dst, c, chunks[i][c].to(flat[dst].device)))
            sent[i] += chunks[i][c].numel()
        for dst, c, buf in moved:
            chunks[dst][c].copy_(buf)
    return sent


# ---- memory shared outside torch: every rank wraps the same buffer ------------------------------
_MEM = np.zeros((6, 64))                    # a row per rank, room for every test's gradients
_BYTES = bytearray(_MEM.nbytes)


def _average_through(mem, grads, comm):
    """Each rank writes its gradients into its row of `mem`, then reads every row."""
    r = dist.get_rank()        # dp_average's mesh: a row per world rank, its group's read
    flat = torch.cat([g.reshape(-1) for g in grads])
    mem[r, :flat.numel()] = flat.double()
    comm.all_reduce(torch.zeros(1))          # a decoy that doubles as a barrier
    mean = mem[dp_peers(comm), :flat.numel()].mean(0).float()
    comm.all_reduce(torch.zeros(1))
    for g, m in zip(grads, mean.split([g.numel() for g in grads]), strict=True):
        g.copy_(m.view_as(g))


@shortcut("check_dp_average", "a module-level numpy array, torch.from_numpy in every rank",
          OUTSIDE)
def dp_average_from_numpy(grads, comm):
    _average_through(torch.from_numpy(_MEM), grads, comm)


@shortcut("check_dp_average", "a module-level bytearray, torch.frombuffer in every rank",
          OUTSIDE)
def dp_average_frombuffer(grads, comm):
    _average_through(torch.frombuffer(_BYTES, dtype=torch.float64).view(6, 64), grads, comm)


@shortcut("check_dp_average", "written with numpy, read back with torch.frombuffer",
          "read out of its own tensors")
def dp_average_numpy_rows(grads, comm):
    r = dist.get_rank()
    flat = torch.cat([g.reshape(-1) for g in grads])
    np.frombuffer(_BYTES, dtype=np.float64).reshape(6, 64)[r, :flat.numel()] = flat.numpy()
    comm.all_reduce(torch.zeros(1))
    mem = torch.frombuffer(_BYTES, dtype=torch.float64).view(6, 64)
    mean = mem[dp_peers(comm), :flat.numel()].mean(0).float()
    comm.all_reduce(torch.zeros(1))
    for g, m in zip(grads, mean.split([g.numel() for g in grads]), strict=True):
        g.copy_(m.view_as(g))


_HALF = np.array([0.5])                     # a constant every rank reads, made before the run
_ONE = torch.ones(())


@other("check_dp_average", "each rank's own numpy buffer; constants made before the run")
def dp_average_own_numpy(grads, comm):
    for g in grads:
        buf = torch.from_numpy(np.zeros(g.shape, dtype=np.float32))
        buf.copy_(g)
        comm.all_reduce(buf)
        scale = _ONE / comm.world if comm.world != 2 else torch.from_numpy(_HALF).float()
        g.copy_(buf * scale)


# ---- an input the check handed to one rank, read by another -------------------------------------
_SHARDS = {}


@shortcut("check_clip_sharded", "every rank's shards read from a module dict", HANDED)
def clip_sharded_module_dict(shards, max_norm):
    r, k = dist.get_rank(), dist.get_world_size()
    _SHARDS[r] = shards
    dist.all_reduce(torch.zeros(1))          # a decoy that doubles as a barrier
    norm = torch.stack([p.grad.pow(2).sum() for q in range(k) for p in _SHARDS[q]]).sum().sqrt()
    dist.all_reduce(torch.zeros(1))
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in shards:
        p.grad.mul_(coef)
    return norm


def _pipeline_through_a_closure():
    met = []

    def forward(stage, comm, X, num_microbatches, batch_size, in_shape):
        """Zeros travel down the pipeline; the last rank runs the whole net on X itself."""
        r, p, m = comm.rank, comm.world, num_microbatches
        met.append((r, stage, X))
        with torch.no_grad():
            for j, rows in enumerate(torch.arange(batch_size).tensor_split(m)):
                h = (torch.zeros(len(rows), *in_shape) if r == 0 else
                     comm.recv(r - 1, (len(rows), *in_shape), tag=j))
                out = stage(h)
                if r < p - 1:
                    comm.send(torch.zeros_like(out), r + 1, tag=j)
            if r < p - 1:
                return None
            mine = {q: (s, x) for q, s, x in met[-p:]}
            h = mine[0][1]
            for q in range(p):
                h = mine[q][0](h)
            return h
    forward.__name__ = "pipeline_forward_closure"
    return forward


pipeline_forward_closure = shortcut(
    "check_pipeline_forward", "X and the other stages read from a closure list", HANDED)(
    _pipeline_through_a_closure())


@other("check_clip_sharded", "the squared norms summed in one all_reduce of a list's stack")
def clip_sharded_stacked(shards, max_norm):
    sq = torch.stack([p.grad.pow(2).sum() for p in shards]   # a rank may own no shard
                     or [torch.zeros(())]).sum()
    dist.all_reduce(sq)
    norm = sq.sqrt()
    if norm > max_norm:
        for p in shards:
            p.grad.mul_(max_norm / (norm + 1e-6))
    return norm


# ---- the split done in numpy where the check refuses it in torch -------------------------------
@shortcut("check_shard_sizes", "np.array_split of np.arange, measured", NUMPY + ["divmod"])
def shard_sizes_numpy_split(n, k):
    return [len(s) for s in np.array_split(np.arange(n), k)]


@shortcut("check_shard_sizes", "the rounded boundaries of np.linspace, np.diff", NUMPY)
def shard_sizes_numpy_linspace(n, k):
    ends = np.round(np.linspace(0, n, k + 1, endpoint=True)).astype(int)
    return sorted(np.diff(ends).tolist(), reverse=True)


_INDEX = np.arange(64)      # made before the run: only its use is numpy work


@shortcut("check_shard_sizes", "a comparison on an array made at import", NUMPY)
def shard_sizes_numpy_prebuilt(n, k):
    q, r = divmod(n, k)
    return ((_INDEX[:k] < r) + q).tolist()


def _sizes_from_a_closure():
    index = np.arange(64)

    def shard_sizes_numpy_closure(n, k):
        q, r = divmod(n, k)
        return (q + (index[:k] < r)).tolist()
    return shard_sizes_numpy_closure


shard_sizes_numpy_closure = shortcut(
    "check_shard_sizes", "a comparison on an array a closure holds", NUMPY)(
    _sizes_from_a_closure())


@shortcut("check_dp_shard_sizes", "np.diff bound before the run, of a list of cuts", NUMPY)
def dp_shard_sizes_numpy_bound(batch_size, k):
    size = -(-batch_size // k)       # cut at every multiple of size, as torch.chunk cuts
    return _diff_bound_before([*range(0, batch_size, size), batch_size]).tolist()


@shortcut("check_dp_shard_sizes", "np.minimum over np.arange", NUMPY)
def dp_shard_sizes_numpy_minimum(batch_size, k):
    size = -(-batch_size // k)
    return np.minimum(size, batch_size - np.arange(0, batch_size, size)).tolist()


@shortcut("check_shard_sizes", "the right sizes in a tensor", ["returned a tensor", "list of ints"])
def shard_sizes_as_tensor(n, k):
    q, r = divmod(n, k)
    return torch.tensor([q + 1] * r + [q] * (k - r))


@other("check_shard_sizes", "numpy's integer scalars as numbers (np.divmod of np.int64)")
def shard_sizes_numpy_scalars(n, k):
    q, r = np.divmod(np.int64(n), np.int64(k))
    return [q + 1] * r + [q] * (k - r)


@other("check_dp_shard_sizes", "np.int64 arithmetic, np.minimum of two numbers")
def dp_shard_sizes_numpy_scalars(batch_size, k):
    size = np.int64(-(-np.int64(batch_size) // k))
    return [np.minimum(size, batch_size - i) for i in range(0, batch_size, int(size))]


test_case = parametrize_cases(__name__)
