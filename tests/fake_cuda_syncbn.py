"""nn.SyncBatchNorm's kernels exist for CUDA only: the same arithmetic on the CPU, which the fake
GPU (tests/fake_cuda.py) runs in their place."""

import torch


def _bn_shape(x):
    return [0] + list(range(2, x.dim())), [1, -1] + [1] * (x.dim() - 2)


def _bn_stats(x, eps):
    dims, _ = _bn_shape(x)
    return x.mean(dims), (x.var(dims, unbiased=False) + eps).rsqrt()


def _bn_gather(x, mean, invstd, running_mean, running_var, momentum, eps, counts):
    c = counts.to(mean.dtype).reshape(-1, 1)
    n = c.sum()
    gmean = (mean * c).sum(0) / n
    gvar = ((invstd.pow(-2) - eps + (mean - gmean).pow(2)) * c).sum(0) / n
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(gmean.to(running_mean.dtype) * momentum)
        if running_var is not None:
            running_var.mul_(1 - momentum).add_(
                (gvar * n / (n - 1)).to(running_var.dtype) * momentum)
    return gmean, (gvar + eps).rsqrt()


def _bn_elemt(x, weight, bias, mean, invstd, eps=None):
    _, shape = _bn_shape(x)
    y = (x - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        y = y * weight.reshape(shape)
    return y + bias.reshape(shape) if bias is not None else y


def _bn_backward_reduce(dy, x, mean, invstd, weight, input_g, weight_g, bias_g):
    dims, shape = _bn_shape(x)
    sum_dy, sum_dy_xmu = dy.sum(dims), (dy * (x - mean.reshape(shape))).sum(dims)
    return sum_dy, sum_dy_xmu, sum_dy_xmu * invstd, sum_dy


def _bn_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    _, shape = _bn_shape(x)
    n = count.sum().to(dy.dtype)
    k = invstd.pow(2) * sum_dy_xmu / n
    scale = invstd * (weight if weight is not None else 1.0)
    return (dy - (sum_dy / n).reshape(shape) - (x - mean.reshape(shape)) * k.reshape(shape)) \
        * scale.reshape(shape)


_SYNCBN = {"batch_norm_stats": _bn_stats, "batch_norm_gather_stats_with_counts": _bn_gather,
           "batch_norm_elemt": _bn_elemt, "batch_norm_backward_reduce": _bn_backward_reduce,
           "batch_norm_backward_elemt": _bn_backward_elemt}
