"""The checks of Part VI's exercises (helpers/checks/splits_dist.py): the reference solutions
pass, a stub reports "not done", and answers that skip the concept fail with their message."""
import pytest
import torch
import torch.nn.functional as F

from helpers.checks import (check_cuts_for_times, check_dp_average, check_idle_share,
                            check_local_shape,
                            check_megatron_mlp, check_mesh_groups, check_pipeline_forward,
                            check_row_parallel_linear, check_tp_ring_bytes)
from helpers import balanced_cuts, copy_to_tp, reduce_from_tp


# --- the reference solutions, as the notebooks have them between the nbgrader markers ---------
def idle_share(timelines):
    ### BEGIN SOLUTION
    events = [e for tl in timelines for e in tl]
    span = max(e["end"] for e in events) - min(e["start"] for e in events)
    busy = sum(e["end"] - e["start"] for e in events)
    return 1 - busy / (len(timelines) * span)
    ### END SOLUTION


def pipeline_forward(stage, comm, X, num_microbatches, batch_size, in_shape):
    ### BEGIN SOLUTION
    r, p, m = comm.rank, comm.world, num_microbatches
    rows = [len(c) for c in torch.arange(batch_size).tensor_split(m)]
    outs = []
    with torch.no_grad():
        for j in range(m):
            if r == 0:
                h = X.tensor_split(m)[j]
            else:
                h = comm.recv(r - 1, (rows[j], *in_shape), tag=j)
            out = stage(h)
            if r < p - 1:
                comm.send(out, r + 1, tag=j)
            outs.append(out)
    comm.wait()
    return torch.cat(outs) if r == p - 1 else None
    ### END SOLUTION


def cuts_for_times(times, p):
    ### BEGIN SOLUTION
    return balanced_cuts(times, p)
    ### END SOLUTION


def row_parallel_linear(x_shard, w_shard, b, comm):
    ### BEGIN SOLUTION
    partial = x_shard @ w_shard.T
    comm.all_reduce(partial)
    return partial + b
    ### END SOLUTION


def megatron_mlp(x, up_w, up_b, down_w, down_b, comm):
    ### BEGIN SOLUTION
    x = copy_to_tp(x, comm)                    # f
    h = F.gelu(x @ up_w.T + up_b)              # this rank's columns
    y = reduce_from_tp(h @ down_w.T, comm)     # g: sum the partial products
    return y + down_b
    ### END SOLUTION


def tp_ring_bytes(batch, seq, width, k):
    ### BEGIN SOLUTION
    activation = batch * seq * width * 4
    return 4 * activation * 2 * (k - 1) / k
    ### END SOLUTION


def mesh_groups(rank, dp, tp):
    ### BEGIN SOLUTION
    i, j = divmod(rank, tp)
    return dict(coords=(i, j), tp_group=[i * tp + c for c in range(tp)],
                dp_group=[r * tp + j for r in range(dp)])
    ### END SOLUTION


def dp_average(grads, comm):
    ### BEGIN SOLUTION
    for g in grads:
        comm.all_reduce(g)
        g /= comm.world
    ### END SOLUTION


def local_shape(shape, split_dim, dp, tp):
    ### BEGIN SOLUTION
    shape = list(shape)
    if split_dim is not None:
        shape[split_dim] //= tp       # tensor parallel slice
    shape[0] //= dp                   # FSDP shards dim 0 of what is left
    return tuple(shape)
    ### END SOLUTION


def stub(*args):
    raise NotImplementedError()


CASES = [(check_idle_share, idle_share), (check_pipeline_forward, pipeline_forward),
         (check_cuts_for_times, cuts_for_times), (check_row_parallel_linear, row_parallel_linear),
         (check_megatron_mlp, megatron_mlp), (check_tp_ring_bytes, tp_ring_bytes),
         (check_mesh_groups, mesh_groups), (check_dp_average, dp_average),
         (check_local_shape, local_shape)]
IDS = [c.__name__ for c, _ in CASES]


@pytest.mark.parametrize("check,solution", CASES, ids=IDS)
def test_solution_passes(check, solution):
    assert check(solution).passed


@pytest.mark.parametrize("check,solution", CASES, ids=IDS)
def test_stub_is_not_done(check, solution):
    assert check(stub).status == "not done"


def test_checks_leave_the_global_generator_alone():
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    check_pipeline_forward(pipeline_forward)
    check_tp_ring_bytes(tp_ring_bytes)
    assert torch.equal(torch.rand(3), want)


def failed(result, *words):
    assert result.status == "failed", result
    for w in words:
        assert w in result.message, result.message
    return result


# --- wrong answers that skip the concept ----------------------------------------------------
def test_idle_share_wrong():
    def formula(timelines):       # the equal-stage formula instead of the measurement
        p = len(timelines)
        m = len(timelines[0]) // 2
        return (p - 1) / (m + p - 1)

    def own_span(timelines):      # each rank's idle time over its own span
        shares = []
        for tl in timelines:
            span = max(e["end"] for e in tl) - min(e["start"] for e in tl)
            shares.append(1 - sum(e["end"] - e["start"] for e in tl) / span)
        return sum(shares) / len(shares)

    failed(check_idle_share(formula), "assumes equal stages")
    failed(check_idle_share(own_span), "whole step")


def test_pipeline_forward_wrong():
    def whole_batch(stage, comm, X, m, n, in_shape):     # no micro-batches
        r, p = comm.rank, comm.world
        with torch.no_grad():
            h = X if r == 0 else comm.recv(r - 1, (n, *in_shape))
            out = stage(h)
        if r < p - 1:
            comm.send(out, r + 1)
        return out

    def no_sends(stage, comm, X, m, n, in_shape):        # every rank on its own
        with torch.no_grad():
            h = X if comm.rank == 0 else torch.zeros(n, *in_shape)
            return torch.cat([stage(c) for c in h.tensor_split(m)])

    def sends_input(stage, comm, X, m, n, in_shape):     # passes X on instead of the output
        r, p = comm.rank, comm.world
        with torch.no_grad():
            outs = []
            for j in range(m):
                h = X.tensor_split(m)[j] if r == 0 else comm.recv(r - 1, (0,))
                if r < p - 1:
                    comm.send(h, r + 1, tag=j)
                outs.append(stage(h))
        return torch.cat(outs)

    failed(check_pipeline_forward(whole_batch), "one per micro-batch")
    failed(check_pipeline_forward(no_sends), "sent nothing")
    failed(check_pipeline_forward(sends_input))


def test_cuts_for_times_wrong():
    def equal_counts(times, p):
        return [round(len(times) * i / p) for i in range(1, p)]

    def off_by_one(times, p):      # the right idea, every cut one layer late
        return [c + 1 for c in balanced_cuts(times, p)]

    failed(check_cuts_for_times(equal_counts), "same number of layers")
    failed(check_cuts_for_times(off_by_one))


def test_row_parallel_linear_wrong():
    def no_reduce(x_shard, w_shard, b, comm):
        return x_shard @ w_shard.T + b

    def bias_each_rank(x_shard, w_shard, b, comm):
        y = x_shard @ w_shard.T + b
        return comm.all_reduce(y)

    failed(check_row_parallel_linear(no_reduce), "partial sum")
    failed(check_row_parallel_linear(bias_each_rank), "bias")


def test_megatron_mlp_wrong():
    def rebuild_weights(x, up_w, up_b, down_w, down_b, comm):   # unsplit product on each rank
        k, r = comm.world, comm.rank
        W1 = torch.zeros(up_w.shape[0] * k, up_w.shape[1])
        W1[r * up_w.shape[0]:(r + 1) * up_w.shape[0]] = up_w
        b1 = torch.zeros(up_b.shape[0] * k)
        b1[r * up_b.shape[0]:(r + 1) * up_b.shape[0]] = up_b
        W2 = torch.zeros(down_w.shape[0], down_w.shape[1] * k)
        W2[:, r * down_w.shape[1]:(r + 1) * down_w.shape[1]] = down_w
        W1, b1, W2 = (reduce_from_tp(t, comm) for t in (W1, b1, W2))
        return F.gelu(x @ W1.T + b1) @ W2.T + down_b

    def no_f(x, up_w, up_b, down_w, down_b, comm):              # forgets f
        y = reduce_from_tp(F.gelu(x @ up_w.T + up_b) @ down_w.T, comm)
        return y + down_b

    def plain_all_reduce(x, up_w, up_b, down_w, down_b, comm):  # g outside autograd
        y = F.gelu(x @ up_w.T + up_b) @ down_w.T
        comm.all_reduce(y.detach())
        return y + down_b

    failed(check_megatron_mlp(rebuild_weights), "rebuilds weights")
    failed(check_megatron_mlp(no_f), "in backward")
    failed(check_megatron_mlp(plain_all_reduce))


def test_tp_ring_bytes_wrong():
    def forward_only(batch, seq, width, k):
        return 2 * batch * seq * width * 4 * 2 * (k - 1) / k

    def payload(batch, seq, width, k):
        return 4 * batch * seq * width * 4

    failed(check_tp_ring_bytes(forward_only), "forward only")
    failed(check_tp_ring_bytes(payload), "payload")


def test_mesh_groups_wrong():
    def column_major(rank, dp, tp):
        j, i = divmod(rank, dp)
        return dict(coords=(i, j), tp_group=[j * dp + c for c in range(dp)][:tp],
                    dp_group=[c * dp + i for c in range(tp)][:dp])

    def swapped(rank, dp, tp):
        i, j = divmod(rank, tp)
        return dict(coords=(i, j), dp_group=[i * tp + c for c in range(tp)],
                    tp_group=[r * tp + j for r in range(dp)])

    failed(check_mesh_groups(column_major))
    failed(check_mesh_groups(swapped), "swapped")


def test_dp_average_wrong():
    def divide_only(grads, comm):
        for g in grads:
            g /= comm.world

    def sum_only(grads, comm):
        for g in grads:
            comm.all_reduce(g)

    def new_tensors(grads, comm):      # averages copies, leaves the gradients alone
        return [comm.all_reduce(g.clone()) / comm.world for g in grads]

    failed(check_dp_average(divide_only), "never called all_reduce")
    failed(check_dp_average(sum_only), "divide")
    failed(check_dp_average(new_tensors), "in place")


def test_local_shape_wrong():
    def tp_only(shape, split_dim, dp, tp):
        shape = list(shape)
        if split_dim is not None:
            shape[split_dim] //= tp
        return tuple(shape)

    def both_on_dim0(shape, split_dim, dp, tp):     # FSDP and TP along the same dim always
        shape = list(shape)
        shape[0] //= dp * (tp if split_dim is not None else 1)
        return tuple(shape)

    def fsdp_ignores_replicated(shape, split_dim, dp, tp):
        shape = list(shape)
        if split_dim is None:
            return tuple(shape)
        shape[split_dim] //= tp
        shape[0] //= dp
        return tuple(shape)

    failed(check_local_shape(tp_only), "FSDP shards it again")
    failed(check_local_shape(both_on_dim0), "row-wise")
    failed(check_local_shape(fsdp_ignores_replicated), "replicated")
