"""check_dp_shard_sizes and check_lr_at of Part III's DataParallel chapter
(helpers/checks/dataparallel.py; check_dp_forward in tests/test_checks_dp_forward.py): the worked
answers, shortcuts of different kinds, other right answers (tests/check_cases.py)."""
import numpy as np
import torch
from check_cases import not_grading, other, parametrize_cases, shortcut, worked  # noqa: F401


# ---- dp_shard_sizes ----------------------------------------------------------------------------
@worked("check_dp_shard_sizes")
def dp_shard_sizes(batch_size, k):
    size = -(-batch_size // k)   # torch.chunk: pieces of ceil(n / k) rows
    return [min(size, batch_size - i) for i in range(0, batch_size, size)]


@other("check_dp_shard_sizes", "a loop, numpy ints")
def dp_shard_sizes_loop(batch_size, k):
    size, out, left = (batch_size + k - 1) // k, [], batch_size
    while left > 0:
        out.append(np.int64(min(size, left)))
        left -= size
    return out


@shortcut("check_dp_shard_sizes", "calls torch.chunk", "no torch.chunk")
def dp_shard_sizes_chunk(batch_size, k):
    return [len(c) for c in torch.arange(batch_size).chunk(k)]


@shortcut("check_dp_shard_sizes", "tensor_split's sizes", "that is tensor_split")
def dp_shard_sizes_split(batch_size, k):
    q, r = divmod(batch_size, k)
    return [q + (i < r) for i in range(k)]


@shortcut("check_dp_shard_sizes", "k pieces, empty ones included",
          [("get no piece at all",   # or, on a batch smaller than k, tensor_split's very sizes
            "that is tensor_split")])
def dp_shard_sizes_padded(batch_size, k):
    size = -(-batch_size // k)
    return [max(0, min(size, batch_size - i * size)) for i in range(k)]


# ---- lr_at -------------------------------------------------------------------------------------
@worked("check_lr_at")
def lr_at(step, base_lr, base_batch, batch, warmup_steps):
    peak = base_lr * batch / base_batch
    return peak * min(1.0, (step + 1) / warmup_steps) if warmup_steps else peak


@other("check_lr_at", "numpy float, another arrangement")
def lr_at_numpy(step, base_lr, base_batch, batch, warmup_steps):
    frac = 1.0 if warmup_steps == 0 or step >= warmup_steps else (step + 1) / warmup_steps
    return np.float64(base_lr) * (batch / base_batch) * frac


@shortcut("check_lr_at", "no warm-up", "ramp up")
def lr_at_no_warmup(step, base_lr, base_batch, batch, warmup_steps):
    return base_lr * batch / base_batch


@shortcut("check_lr_at", "no scaling", "grow with the batch")
def lr_at_unscaled(step, base_lr, base_batch, batch, warmup_steps):
    return base_lr * min(1.0, (step + 1) / warmup_steps) if warmup_steps else base_lr


@shortcut("check_lr_at", "warm-up off by one", "off by one")
def lr_at_off_by_one(step, base_lr, base_batch, batch, warmup_steps):
    peak = base_lr * batch / base_batch
    return peak * min(1.0, step / warmup_steps) if warmup_steps else peak


test_case = parametrize_cases(__name__)
