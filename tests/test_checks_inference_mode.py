"""An answer written under `torch.inference_mode()` is judged as the same answer under
`torch.no_grad()`: the harness's dispatch modes see a composite operation's parts either way
(`.item()` as `_local_scalar_dense`, `.to()` as `_to_copy`), so a refusal keyed on them still
refuses and a transfer is still counted; a World's records of a message sent under it (an
inference tensor has no version counter) do not read as tampering; and a value read out on the
simulated GPUs is the CPU run's, replayed."""
import contextlib
import io

import torch
import torch.distributed as dist
from check_cases import not_grading, other, parametrize_cases, shortcut  # noqa: F401

import helpers
from helpers import get_params, split_batch, unflatten_into
from helpers.checks._core import FakeGPUs, Recorder


@shortcut("check_global_mean_var", "means and variances read out with .item() under "
          "inference mode, merged exactly in Fractions", "out of torch")
def global_mean_var_read_in_inference_mode(counts, means, variances):
    from fractions import Fraction as Q
    w, c = means.shape
    with torch.inference_mode():
        n = [Q(counts[r].item()) for r in range(w)]
        mu = [[Q(means[r, j].item()) for j in range(c)] for r in range(w)]
        var = [[Q(variances[r, j].item()) for j in range(c)] for r in range(w)]
    total = sum(n)
    mean = [sum(n[r] * mu[r][j] for r in range(w)) / total for j in range(c)]
    sq = [sum(n[r] * (var[r][j] + mu[r][j] ** 2) for r in range(w)) / total for j in range(c)]
    return (torch.tensor([float(m) for m in mean]),
            torch.tensor([float(s - m ** 2) for s, m in zip(sq, mean, strict=True)]))


@other("check_evaluate_accuracy_multi", "inference mode, .item() of each device's count")
@torch.inference_mode()
def evaluate_accuracy_multi_inference(net, params, data_iter, devices):
    replicas = [get_params(params, d) for d in devices]
    correct = [torch.zeros((), device=d) for d in devices]
    total = 0
    for X, y in data_iter:
        for i, (W, Xs, ys) in enumerate(zip(replicas, *split_batch(X, y, devices))):
            correct[i] += (net(Xs, W).argmax(dim=1) == ys).sum()
        total += y.numel()
    return sum(c.item() for c in correct) / total


@other("check_reduce_then_broadcast", "inference mode, with a sanity assert on the sum")
def reduce_then_broadcast_inference(grads):
    with torch.inference_mode():
        total = sum(g.to(grads[0].device) for g in grads)
        assert torch.isfinite(total).all(), "overflow in the gradient sum"
        assert not torch.isnan(total).any()
        for g in grads:
            g.copy_(total)
        assert all(torch.allclose(g, grads[0].to(g.device)) for g in grads)


@other("check_bucket_allreduce", "inference mode")
@torch.inference_mode()
def bucket_allreduce_inference(grads, bucket_bytes):
    bucket, size = [], 0
    for i, g in enumerate(grads[0]):
        bucket.append(i)
        size += g.numel() * g.element_size()
        if size >= bucket_bytes or i == len(grads[0]) - 1:
            flats = [torch.cat([g[j].reshape(-1) for j in bucket]) for g in grads]
            for f in flats[1:]:
                flats[0] += f.to(flats[0].device)
            for g in grads:
                unflatten_into(flats[0].to(g[0].device), [g[j] for j in bucket])
            bucket, size = [], 0


@other("check_pipeline_forward", "inference mode (a forward pass for inference)")
@torch.inference_mode()
def pipeline_forward_inference(stage, comm, X, num_microbatches, batch_size, in_shape):
    r, p, m = comm.rank, comm.world, num_microbatches
    rows = [len(c) for c in torch.arange(batch_size).tensor_split(m)]
    outs = []
    for j in range(m):
        h = X.tensor_split(m)[j] if r == 0 else comm.recv(r - 1, (rows[j], *in_shape), tag=j)
        out = stage(h)
        if r < p - 1:
            comm.send(out, r + 1, tag=j)
        outs.append(out)
    comm.wait()
    return torch.cat(outs) if r == p - 1 else None


@other("check_average_bucket", "inference mode")
@torch.inference_mode()
def average_bucket_inference(grads):
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


@other("check_row_parallel_linear", "inference mode")
@torch.inference_mode()
def row_parallel_linear_inference(x_shard, w_shard, b, comm):
    partial = x_shard @ w_shard.T
    comm.all_reduce(partial)
    return partial + b


test_case = parametrize_cases(__name__)


def _seen(mode):
    """The operation names a Recorder saw, and the transfers on two simulated GPUs."""
    t = torch.ones(3)
    with Recorder() as rec, mode():
        t[0].item()
        t.to(torch.float64)
        torch.nn.functional.conv2d(torch.ones(1, 2, 3, 3), torch.ones(1, 2, 2, 2))
    gpus = FakeGPUs(2)
    a, b = gpus.tensor(torch.ones(3), 0), gpus.tensor(torch.ones(3), 1)

    def move(a, b):
        with mode():
            b.copy_(a + b.to(a.device))
            return (a > 0).sum().item()
    read, fake = gpus.run(move, a, b)
    return [op.name for op in rec.ops], len(fake.transfers()), read


def test_inference_mode_shows_the_same_operations():
    """`.item()`, `.to()`, `conv2d`: the parts a Recorder sees outside inference mode, inside it
    too; a copy between simulated GPUs counts as a transfer and `.item()` is answered."""
    names, transfers, read = _seen(torch.inference_mode)
    assert (names, transfers, read) == _seen(torch.no_grad)
    assert "_local_scalar_dense" in names and "item" not in names and transfers == 2


def test_a_value_read_on_the_simulated_gpus_is_the_cpu_runs():
    """An answer right on CPU tensors with an assert on a value read out: the simulated GPUs
    replay the CPU run's value (placeholders.py), so the assert holds there too and it passes
    (a placeholder 0 once made it the grader's error)."""
    def reduce_then_broadcast_positive(grads):
        total = sum(g.to(grads[0].device) for g in grads)
        assert total.abs().sum().item() > 0, "an all-zero gradient"
        for g in grads:
            g.copy_(total)
    with contextlib.redirect_stdout(io.StringIO()):
        result = helpers.checks.check_reduce_then_broadcast(reduce_then_broadcast_positive)
    assert result.status == "passed", result
