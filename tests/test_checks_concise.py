"""The checks of Part III's exercises (helpers/checks/concise.py): the reference solutions pass,
a stub reports "not done", and typical wrong answers fail with their message."""
import contextlib
import copy

import pytest
import torch

from helpers.checks import (check_dp_forward, check_sync_bn_input_grads,
                            check_unused_parameters, check_update_running_stats,
                            check_accumulate_gradients, check_dp_shard_sizes, check_global_mean_var,
                            check_lr_at, check_strip_module_prefix)


# The reference solutions, as the notebooks have them between the nbgrader markers.
def dp_shard_sizes(batch_size, k):
    ### BEGIN SOLUTION
    size = -(-batch_size // k)   # torch.chunk: pieces of ceil(n / k) rows, the last one smaller
    return [min(size, batch_size - i) for i in range(0, batch_size, size)]
    ### END SOLUTION


def lr_at(step, base_lr, base_batch, batch, warmup_steps):
    ### BEGIN SOLUTION
    peak = base_lr * batch / base_batch
    return peak * min(1.0, (step + 1) / warmup_steps) if warmup_steps else peak
    ### END SOLUTION


def strip_module_prefix(state_dict):
    ### BEGIN SOLUTION
    return {k.removeprefix("module."): v for k, v in state_dict.items()}
    ### END SOLUTION


def accumulate_gradients(model, loss_fn, micro_batches):
    ### BEGIN SOLUTION
    k = len(micro_batches)
    for i, (X, y) in enumerate(micro_batches):
        last = i == k - 1
        with (contextlib.nullcontext() if last else model.no_sync()):
            (loss_fn(model(X), y) / k).backward()
    ### END SOLUTION


def global_mean_var(counts, means, variances):
    ### BEGIN SOLUTION
    n = counts.sum()
    w = (counts / n)[:, None]                  # each rank's share of the batch
    mean = (w * means).sum(0)
    var = (w * (variances + (means - mean) ** 2)).sum(0)
    return mean, var
    ### END SOLUTION


def dp_forward(net, X, devices):
    ### BEGIN SOLUTION
    replicas = [copy.deepcopy(net).to(d) for d in devices]       # replicate
    pieces = X.chunk(len(devices))                                 # scatter
    outs = [r(x.to(d)) for r, x, d in zip(replicas, pieces, devices)]   # parallel_apply
    return torch.cat([o.to(devices[0]) for o in outs])             # gather
    ### END SOLUTION


def unused_parameters(model, loss):
    ### BEGIN SOLUTION
    seen, stack = set(), [loss.grad_fn]
    while stack:   # walk the autograd graph from the loss, as DDP does
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):   # AccumulateGrad: a leaf the loss reaches
            seen.add(node.variable)
        stack += [f for f, _ in node.next_functions]
    return sorted(n for n, p in model.named_parameters()
                  if not any(p is v for v in seen if isinstance(v, torch.Tensor)))
    ### END SOLUTION


def update_running_stats(running_mean, running_var, mean, var, n, momentum):
    ### BEGIN SOLUTION
    new_mean = (1 - momentum) * running_mean + momentum * mean
    new_var = (1 - momentum) * running_var + momentum * var * n / (n - 1)
    return new_mean, new_var
    ### END SOLUTION


def sync_bn_input_grads(dys, x_hats, invstd):
    ### BEGIN SOLUTION
    n = sum(d.shape[0] for d in dys)                     # all-reduced count
    sum_dy = sum(d.sum(0) for d in dys)                  # all-reduce of two sums
    sum_dy_xhat = sum((d * x).sum(0) for d, x in zip(dys, x_hats))
    return [invstd * (d - sum_dy / n - x * sum_dy_xhat / n)
            for d, x in zip(dys, x_hats)]
    ### END SOLUTION


def stub(*args):
    raise NotImplementedError()


CHECKS = [(check_dp_shard_sizes, dp_shard_sizes), (check_lr_at, lr_at),
          (check_strip_module_prefix, strip_module_prefix),
          (check_accumulate_gradients, accumulate_gradients),
          (check_global_mean_var, global_mean_var),
          (check_dp_forward, dp_forward), (check_unused_parameters, unused_parameters),
          (check_update_running_stats, update_running_stats),
          (check_sync_bn_input_grads, sync_bn_input_grads)]
IDS = [c.__name__ for c, _ in CHECKS]


@pytest.mark.parametrize("check,solution", CHECKS, ids=IDS)
def test_reference_solution_passes(check, solution):
    for _ in range(5):
        result = check(solution)
        assert result and result.status == "passed", result


@pytest.mark.parametrize("check,solution", CHECKS, ids=IDS)
def test_stub_reports_not_done(check, solution, capsys):
    result = check(stub)
    assert result.status == "not done" and not result
    assert "not done yet" in capsys.readouterr().out


@pytest.mark.parametrize("check,solution", CHECKS, ids=IDS)
def test_inputs_are_fresh(check, solution):
    seen = [[], []]
    for run in seen:
        check(lambda *a: (run.append(repr(a)), solution(*a))[1])
    assert seen[0] and seen[0] != seen[1]


def test_checks_leave_torch_random_state_alone():
    state = torch.get_rng_state()
    for check, solution in CHECKS:
        check(solution)
    assert torch.equal(state, torch.get_rng_state())


def failed(result, *words):
    return result.status == "failed" and all(w in result.message for w in words)


def test_dp_shard_sizes_is_not_tensor_split():
    r = check_dp_shard_sizes(lambda n, k: [len(c) for c in torch.arange(n).tensor_split(k)])
    assert failed(r, "torch.chunk")


def test_dp_shard_sizes_with_empty_pieces_fails():
    """Always k pieces, padded with empty ones: chunk returns fewer pieces instead."""
    def padded(n, k):
        sizes = [len(c) for c in torch.arange(n).chunk(k)]
        return sizes + [0] * (k - len(sizes))
    assert failed(check_dp_shard_sizes(padded), "get no piece at all")


def test_dp_shard_sizes_floor_division_fails():
    assert failed(check_dp_shard_sizes(lambda n, k: [n // k] * (k - 1) + [n - n // k * (k - 1)]),
                  "expected")


def test_lr_at_wrong_answers():
    assert failed(check_lr_at(lambda s, lr, b0, b, w: lr), "linear scaling")
    assert failed(check_lr_at(lambda s, lr, b0, b, w: lr * b / b0), "ramp up")
    assert failed(check_lr_at(lambda s, lr, b0, b, w: lr * b / b0 * min(1, s / w) if w
                              else lr * b / b0), "off by one")


def test_strip_module_prefix_with_replace_breaks_submodules():
    r = check_strip_module_prefix(lambda sd: {k.replace("module.", ""): v for k, v in sd.items()})
    assert failed(r, "LEADING")


def test_strip_module_prefix_must_not_modify_its_argument():
    def in_place(sd):
        for k in list(sd):
            sd[k.removeprefix("module.")] = sd.pop(k)
        return sd
    assert failed(check_strip_module_prefix(in_place), "new dict")


def test_accumulate_gradients_wrong_answers():
    def no_no_sync(model, loss_fn, micro):
        for X, y in micro:
            (loss_fn(model(X), y) / len(micro)).backward()

    def unscaled(model, loss_fn, micro):
        for i, (X, y) in enumerate(micro):
            with (contextlib.nullcontext() if i == len(micro) - 1 else model.no_sync()):
                loss_fn(model(X), y).backward()

    def all_no_sync(model, loss_fn, micro):
        with model.no_sync():
            for X, y in micro:
                (loss_fn(model(X), y) / len(micro)).backward()

    assert failed(check_accumulate_gradients(no_no_sync), "only the last")
    assert failed(check_accumulate_gradients(unscaled), "too large")
    assert failed(check_accumulate_gradients(all_no_sync), "never all-reduced")


def test_global_mean_var_wrong_answers():
    def mean_of_means(counts, means, variances):
        mean = means.mean(0)
        return mean, (variances + (means - mean) ** 2).mean(0)

    def within_only(counts, means, variances):
        w = (counts / counts.sum())[:, None]
        return (w * means).sum(0), (w * variances).sum(0)

    def unbiased(counts, means, variances):
        n = counts.sum()
        mean, var = global_mean_var(counts, means, variances)
        return mean, var * n / (n - 1)

    def naive(counts, means, variances):
        """Rebuild sums and sums of squares, then E[x^2] - E[x]^2 in float32."""
        n = counts.sum()
        sums = counts[:, None] * means
        sumsqs = counts[:, None] * (variances + means ** 2)
        mean = sums.sum(0) / n
        return mean, sumsqs.sum(0) / n - mean * mean

    assert failed(check_global_mean_var(mean_of_means), "weight each mean by its rank's count")
    assert failed(check_global_mean_var(within_only), "leaves out how far each rank's mean")
    assert failed(check_global_mean_var(unbiased), "unbiased")
    assert failed(check_global_mean_var(naive), "E[x^2] - E[x]^2")


def test_dp_forward_wrong_answers():
    def unsplit(net, X, devices):
        return net(X)

    def tensor_split(net, X, devices):
        replicas = [copy.deepcopy(net) for _ in devices]
        return torch.cat([r(x) for r, x in zip(replicas, X.tensor_split(len(devices)))])

    def one_module(net, X, devices):
        return torch.cat([net(x) for x in X.chunk(len(devices))])

    assert failed(check_dp_forward(unsplit), "ran once on all")
    assert failed(check_dp_forward(tensor_split), "tensor_split")
    assert failed(check_dp_forward(one_module), "original module ran")


def test_unused_parameters_wrong_answers():
    def by_backward(model, loss):
        loss.backward()
        return sorted(n for n, p in model.named_parameters() if p.grad is None)

    def zero_grad_means_unused(model, loss):
        names, params = zip(*model.named_parameters())
        grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
        return sorted(n for n, gr in zip(names, grads) if gr is None or not gr.any())

    assert failed(check_unused_parameters(by_backward), "ran a backward")
    assert failed(check_unused_parameters(zero_grad_means_unused), "zero weight")


def test_update_running_stats_wrong_answers():
    def biased(rm, rv, mean, var, n, m):
        return (1 - m) * rm + m * mean, (1 - m) * rv + m * var

    def flipped(rm, rv, mean, var, n, m):
        return m * rm + (1 - m) * mean, m * rv + (1 - m) * var * n / (n - 1)

    assert failed(check_update_running_stats(biased), "unbiased")
    assert failed(check_update_running_stats(flipped), "NEW batch mean")


def test_sync_bn_input_grads_wrong_answers():
    def local(dys, x_hats, invstd):
        return [invstd * (d - d.mean(0) - x * (d * x).mean(0)) for d, x in zip(dys, x_hats)]

    def mean_of_means(dys, x_hats, invstd):
        m1 = torch.stack([d.mean(0) for d in dys]).mean(0)
        m2 = torch.stack([(d * x).mean(0) for d, x in zip(dys, x_hats)]).mean(0)
        return [invstd * (d - m1 - x * m2) for d, x in zip(dys, x_hats)]

    assert failed(check_sync_bn_input_grads(local), "per-device")
    assert failed(check_sync_bn_input_grads(mean_of_means), "averaged the ranks' means")
