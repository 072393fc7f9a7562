"""A thread or pool task the answer starts and leaves running when it returns fails the answer
(helpers/checks/_core/outlived.py): the check reads the result after the call (a World's after
`w.run`), so work the thread does later (the all-reduce, the copy into the gradients) would
look like the answer's; on gloo and NCCL the function has returned without it. Shortcuts that
defer their work into a Thread, an executor's task, a pool's initializer, a multiprocessing
pool's task or a Timer fail in World checks and in single-process checks (a custom backward's
thread too, run by the check after the call: late.py); right answers that
join, wait for the task's future or leave the executor's (or a multiprocessing ThreadPool's)
`with` block pass (tests/check_cases.py)."""
import asyncio
import multiprocessing.dummy  # ThreadPool's lazy imports, made here (not inside the answers,
import multiprocessing.queues  # where a first import makes patched.py read the namespaces
import multiprocessing.synchronize  # noqa: F401  again while it runs)
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.pool import ThreadPool

import torch
import torch.distributed as dist
from check_cases import dp_group, other, parametrize_cases, shortcut

import helpers

LATE = 0.3          # seconds a shortcut's thread waits before its work (the call has returned)
THREAD = ["returned from", "while a thread it started was still running", "join it",
          "not your function's result"]
TASK = ["while a task it submitted to a thread pool was still running", "future.result()"]
INIT = ["while the initializer of a thread pool it made was still running"]
RESULT = ["while a task it handed a multiprocessing pool was still running", ".get()"]


def _later(work):
    def run():
        time.sleep(LATE)
        work()
    return run


# ---- average_bucket (ddp_scratch.py): a World check, in place ----------------------------------
def _average(grads):
    """The bucket's average, written back into `grads` (the worked answer's steps)."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    o = 0
    for g in grads:
        g.copy_(flat[o:o + g.numel()].view_as(g))
        o += g.numel()


@shortcut("check_average_bucket", "the averaging left to a thread never joined", THREAD)
def average_bucket_thread_late(grads):
    threading.Thread(target=_later(lambda: _average(grads)), daemon=True).start()


@shortcut("check_average_bucket", "the averaging submitted to a pool, never waited for", TASK)
def average_bucket_pool_nowait(grads):
    pool = ThreadPoolExecutor(1)
    pool.submit(_later(lambda: _average(grads)))
    pool.shutdown(wait=False)


@shortcut("check_average_bucket", "the averaging in a pool's initializer, only the tasks waited",
          INIT)
def average_bucket_initializer_late(grads):
    started = []

    def initializer():          # the second worker's: it runs while the first does the tasks
        started.append(1)
        if len(started) == 2:
            time.sleep(1.0)
            _average(grads)
    pool = ThreadPoolExecutor(2, initializer=initializer)
    futures = [pool.submit(time.sleep, 0.1), pool.submit(int)]     # busy: a second worker
    for f in futures:
        f.result()
    pool.shutdown(wait=False)


@other("check_average_bucket", "the averaging on a thread, joined")
def average_bucket_thread_joined(grads):
    t = threading.Thread(target=_average, args=(grads,))
    t.start()
    t.join()


@other("check_average_bucket", "the averaging submitted to a pool, its future waited for")
def average_bucket_pool_waited(grads):
    with ThreadPoolExecutor(1) as pool:
        pool.submit(_average, grads).result()


# ---- dp_average (mesh2d.py): a World check, in place -------------------------------------------
def _mean(grads, group=None):
    for g in grads:
        dist.all_reduce(g, op=dist.ReduceOp.AVG, group=group)


@shortcut("check_dp_average", "the all-reduces left to a thread never joined", THREAD)
def dp_average_thread_late(grads, comm):
    group = dp_group(comm)
    threading.Thread(target=_later(lambda: _mean(grads, group)), daemon=True).start()


@shortcut("check_dp_average", "the all-reduces submitted to a pool, never waited for", TASK)
def dp_average_pool_nowait(grads, comm):
    group, pool = dp_group(comm), ThreadPoolExecutor(1)
    pool.submit(_later(lambda: _mean(grads, group)))
    pool.shutdown(wait=False)


@shortcut("check_dp_average", "the all-reduces handed to a multiprocessing ThreadPool, "
          "never waited for", RESULT)
def dp_average_thread_pool_nowait(grads, comm):
    group, pool = dp_group(comm), ThreadPool(1)
    pool.apply_async(_later(lambda: _mean(grads, group)))
    pool.close()


@shortcut("check_dp_average", "the all-reduces on a Timer's thread", THREAD)
def dp_average_timer(grads, comm):
    threading.Timer(LATE, _mean, args=(grads, dp_group(comm))).start()


@other("check_dp_average", "the all-reduces on a thread, joined")
def dp_average_thread_joined(grads, comm):
    t = threading.Thread(target=_mean, args=(grads, dp_group(comm)))
    t.start()
    t.join()


@other("check_dp_average", "each all-reduce mapped on an executor, in its `with` block")
def dp_average_pool_map(grads, comm):
    group = dp_group(comm)
    with ThreadPoolExecutor(1) as pool:
        list(pool.map(lambda g: dist.all_reduce(g, op=dist.ReduceOp.AVG, group=group), grads))


@other("check_dp_average", "each all-reduce mapped on a multiprocessing ThreadPool")
def dp_average_thread_pool_map(grads, comm):
    group = dp_group(comm)
    with ThreadPool(1) as pool:         # its exit stops the workers without joining them
        pool.map(lambda g: dist.all_reduce(g, op=dist.ReduceOp.AVG, group=group), grads)


# ---- combine_mean_grads (data_parallel.py): one process, the result written in later ----------
def _combined(grads, sizes):
    return sum(g * s for g, s in zip(grads, sizes, strict=True)) / sum(sizes)


@shortcut("check_combine_mean_grads", "the result written in by a thread never joined",
          ["combine_mean_grads_thread_late returned while a thread it started was still "
           "running", "join it"])
def combine_mean_grads_thread_late(grads, sizes):
    out = torch.zeros_like(grads[0])
    threading.Thread(target=_later(lambda: out.copy_(_combined(grads, sizes))),
                     daemon=True).start()
    return out


@shortcut("check_combine_mean_grads", "the result written in by a pool's task, never waited for",
          TASK)
def combine_mean_grads_pool_nowait(grads, sizes):
    out = torch.zeros_like(grads[0])
    pool = ThreadPoolExecutor(1)
    pool.submit(_later(lambda: out.copy_(_combined(grads, sizes))))
    pool.shutdown(wait=False)
    return out


@other("check_combine_mean_grads", "computed on a thread, joined")
def combine_mean_grads_thread_joined(grads, sizes):
    out = torch.zeros_like(grads[0])
    t = threading.Thread(target=lambda: out.copy_(_combined(grads, sizes)))
    t.start()
    t.join()
    return out


@other("check_combine_mean_grads", "computed by a pool's task, in the executor's `with` block")
def combine_mean_grads_pool_waited(grads, sizes):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_combined, grads, sizes).result()


@other("check_combine_mean_grads", "computed in asyncio's default executor")
def combine_mean_grads_asyncio(grads, sizes):
    async def main():
        return await asyncio.get_running_loop().run_in_executor(None, _combined, grads, sizes)
    return asyncio.run(main())


# ---- z_loss (expert_parallel.py): the gradient filled in after the check's backward returned --
class _ZLoss(torch.autograd.Function):
    """The z-loss, whose backward returns a zero gradient that a thread fills in later."""

    @staticmethod
    def forward(ctx, logits):
        ctx.save_for_backward(logits)
        return (torch.logsumexp(logits, -1) ** 2).mean()

    @staticmethod
    def backward(ctx, g):
        (logits,) = ctx.saved_tensors
        out = torch.zeros_like(logits)
        lse = torch.logsumexp(logits, -1, keepdim=True)
        threading.Thread(target=_later(lambda: out.copy_(
            g * 2 * lse * torch.softmax(logits, -1) / len(logits))), daemon=True).start()
        return out


@shortcut("check_z_loss", "its backward's gradient written in by a thread never joined",
          ["(its backward, run by the check after your function returned) returned while a "
           "thread it started was still running", "join it"])
def z_loss_backward_late(logits):
    return _ZLoss.apply(logits)


test_case = parametrize_cases(__name__)


def test_a_thread_left_blocked_in_a_collective_is_refused_not_waited_out():
    """Rank 0's thread waits in a barrier no other rank joins, while rank 1 still works: rank
    0's return refuses it at once, and the refusal ends the thread's wait (no timeout waited
    out, no hang)."""
    def dp_average(grads, comm):
        _mean(grads, dp_group(comm))
        if dist.get_rank() == 0:
            threading.Thread(target=lambda: dist.barrier(), daemon=True).start()
        else:
            time.sleep(0.2)
    began = time.monotonic()
    result = helpers.checks.check_dp_average(dp_average)
    assert result.status == "failed" and "rank 0 returned from dp_average while a thread" in \
        result.message, result
    assert time.monotonic() - began < 10, "the check waited for the blocked thread"
