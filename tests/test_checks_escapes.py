"""Shortcut answers that step outside what the checks watch: work done in another process
(forked, or a fresh interpreter that imports the course again), torch's dispatch switched off
around the work (the Recorder and the ranks' ownership watch through it), and a returned tensor
of the answer's own subclass that answers the check's comparisons itself. Each must fail; a
right answer that only moves host-made buffers to the devices must pass
(tests/check_cases.py's form; helpers/checks/_core/guard.py and references.py)."""
import concurrent.futures
import multiprocessing as mp

import torch
from torch.utils._python_dispatch import _disable_current_modes

from check_cases import other, parametrize_cases, shortcut

PROCESS = "starts another process"
DISPATCH = "switches off torch's dispatch"


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
    _POST[comm.rank] = grads
    comm.all_reduce(torch.zeros(1))
    with _disable_current_modes():
        means = [torch.stack([_POST[r][i] for r in range(comm.world)]).mean(0)
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


test_case = parametrize_cases(__name__)
