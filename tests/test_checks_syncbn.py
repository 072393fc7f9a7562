"""The checks of the BatchNorm-across-devices chapter (helpers/checks/syncbn.py): the worked
answers, shortcuts of different kinds (known cheats included: E[x^2] - E[x]^2 in float64),
other right answers (tests/check_cases.py)."""
import torch
import torch.distributed as dist
from check_cases import other, parametrize_cases, shortcut, worked

import helpers.checks
from helpers.checks._core import replay_seeds


# ---- global_mean_var ---------------------------------------------------------------------------
@worked("check_global_mean_var")
def global_mean_var(counts, means, variances):
    n = counts.sum()
    w = (counts / n)[:, None]                  # each rank's share of the batch
    mean = (w * means).sum(0)
    var = (w * (variances + (means - mean) ** 2)).sum(0)
    return mean, var


@other("check_global_mean_var", "shifted by rank 0's mean")
def global_mean_var_shifted(counts, means, variances):
    c = counts[:, None]
    d = means - means[0]                       # exact: close float32 numbers
    n = c.sum()
    shift = (c * d).sum(0) / n
    return means[0] + shift, (c * (variances + d * d)).sum(0) / n - shift * shift


@shortcut("check_global_mean_var", "a stable formula, but in numpy (out of the check's sight)",
          ".numpy()")
def global_mean_var_shifted_numpy(counts, means, variances):
    c, m, v = counts.numpy()[:, None], means.numpy(), variances.numpy()
    d = m - m[0]
    n = c.sum()
    shift = (c * d).sum(0) / n
    return m[0] + shift, (c * (v + d * d)).sum(0) / n - shift * shift


@shortcut("check_global_mean_var", "a stable formula in Python floats via .numpy().tolist()",
          ".numpy()")
def global_mean_var_numpy_tolist(counts, means, variances):
    c, m, v = counts.tolist(), means.numpy().tolist(), variances.numpy().tolist()
    n, cols = sum(c), range(len(m[0]))
    mean = [sum(ci * mi[j] for ci, mi in zip(c, m)) / n for j in cols]
    var = [sum(ci * (vi[j] + (mi[j] - mean[j]) ** 2) for ci, mi, vi in zip(c, m, v)) / n
           for j in cols]
    return torch.tensor(mean), torch.tensor(var)


@shortcut("check_global_mean_var", "the worked answer with a debugging print of the means",
          ["printing", "remove the print, or print their shapes"])
def global_mean_var_debug_print(counts, means, variances):
    print("means:", means)          # a display the check cannot tell from reading the values
    return global_mean_var(counts, means, variances)


@shortcut("check_global_mean_var", "a stable formula on values parsed from print", "printing")
def global_mean_var_printed(counts, means, variances):
    torch.set_printoptions(precision=12)
    try:
        m = torch.tensor(eval(repr(means)[7:-1].replace("\n", "")), dtype=torch.float64)
        v = torch.tensor(eval(repr(variances)[7:-1].replace("\n", "")), dtype=torch.float64)
    finally:
        torch.set_printoptions(profile="default")
    c = counts.double()[:, None]
    mean = (c * m).sum(0) / c.sum()
    return mean.float(), ((c * (v + (m - mean) ** 2)).sum(0) / c.sum()).float()


@shortcut("check_global_mean_var", "float bits read through an integer view", ".tolist()")
def global_mean_var_int_view(counts, means, variances):
    import struct
    bits = means.view(torch.int32).tolist() + variances.view(torch.int32).tolist()
    rows = [[struct.unpack("f", struct.pack("i", b))[0] for b in row] for row in bits]
    w = len(counts)
    m, v = torch.tensor(rows[:w]), torch.tensor(rows[w:])
    n = counts.sum()
    mean = (counts[:, None] * m).sum(0) / n
    return mean, (counts[:, None] * (v + (m - mean) ** 2)).sum(0) / n


@shortcut("check_global_mean_var", "E[x^2] - E[x]^2 in float64", "float64")
def global_mean_var_float64(counts, means, variances):
    c, m, v = counts.double()[:, None], means.double(), variances.double()
    n = c.sum()
    mean = (c * m).sum(0) / n
    return mean.float(), ((c * (v + m * m)).sum(0) / n - mean * mean).float()


@shortcut("check_global_mean_var", "E[x^2] - E[x]^2 in float32", "E[x^2] - E[x]^2")
def global_mean_var_naive(counts, means, variances):
    n = counts.sum()
    mean = (counts[:, None] * means).sum(0) / n
    return mean, (counts[:, None] * (variances + means ** 2)).sum(0) / n - mean * mean


@shortcut("check_global_mean_var", "E[x^2] - E[x]^2 in Python floats, .tolist()",
          "into Python numbers")
def global_mean_var_python_floats(counts, means, variances):
    c, m, v = counts.tolist(), means.tolist(), variances.tolist()
    n = sum(c)
    mean = [sum(ci * mi[j] for ci, mi in zip(c, m)) / n for j in range(len(m[0]))]
    sq = [sum(ci * (vi[j] + mi[j] ** 2) for ci, mi, vi in zip(c, m, v)) / n
          for j in range(len(m[0]))]
    return torch.tensor(mean), torch.tensor([s - mu * mu for s, mu in zip(sq, mean)])


@shortcut("check_global_mean_var", "E[x^2] - E[x]^2 in exact fractions",
          ".tolist()")
def global_mean_var_fractions(counts, means, variances):
    from fractions import Fraction
    c = [Fraction(x) for x in counts.tolist()]
    m = [[Fraction(x) for x in row] for row in means.tolist()]
    v = [[Fraction(x) for x in row] for row in variances.tolist()]
    n, cols = sum(c), range(len(m[0]))
    mean = [sum(ci * mi[j] for ci, mi in zip(c, m)) / n for j in cols]
    var = [sum(ci * (vi[j] + mi[j] ** 2) for ci, mi, vi in zip(c, m, v)) / n - mean[j] ** 2
           for j in cols]
    return torch.tensor([float(x) for x in mean]), torch.tensor([float(x) for x in var])


@shortcut("check_global_mean_var", "E[x^2] - E[x]^2 in exact fractions, element by element",
          ".item() or float()")
def global_mean_var_fractions_items(counts, means, variances):
    from fractions import Fraction
    c = [Fraction(float(x)) for x in counts]
    m = [[Fraction(float(x)) for x in row] for row in means]
    v = [[Fraction(float(x)) for x in row] for row in variances]
    n, cols = sum(c), range(len(m[0]))
    mean = [sum(ci * mi[j] for ci, mi in zip(c, m)) / n for j in cols]
    var = [sum(ci * (vi[j] + mi[j] ** 2) for ci, mi, vi in zip(c, m, v)) / n - mean[j] ** 2
           for j in cols]
    return torch.tensor([float(x) for x in mean]), torch.tensor([float(x) for x in var])


def _stable_from_bits(counts, bits):
    """The stable formula, in Python floats rebuilt from float32 bits read out of torch."""
    import struct
    rows = [[struct.unpack("f", struct.pack("i", b))[0] for b in row] for row in bits]
    w = len(counts)
    m, v = torch.tensor(rows[:w]), torch.tensor(rows[w:])
    n = counts.sum()
    mean = (counts[:, None] * m).sum(0) / n
    return mean, (counts[:, None] * (v + (m - mean) ** 2)).sum(0) / n


@shortcut("check_global_mean_var", "float bits read through an integer copy", ".tolist()")
def global_mean_var_int_copy(counts, means, variances):
    return _stable_from_bits(counts, means.view(torch.int32).clone().tolist()
                             + variances.view(torch.int32).clone().tolist())


@shortcut("check_global_mean_var", "float bits read through an int64 cast", ".tolist()")
def global_mean_var_int64_cast(counts, means, variances):
    bits = [t.view(torch.int32).to(torch.int64) for t in (means, variances)]
    return _stable_from_bits(counts, bits[0].tolist() + bits[1].tolist())


@shortcut("check_global_mean_var", "float bits read one true/false flag each",
          "true/false flags")
def global_mean_var_bit_flags(counts, means, variances):
    shifts = torch.arange(32, dtype=torch.int32)
    rows = []
    for t in (means, variances):
        flags = ((t.view(torch.int32)[..., None] >> shifts) & 1).bool().tolist()
        rows += [[sum(b << i for i, b in enumerate(el)) for el in row] for row in flags]
    rows = [[b - (1 << 32) if b >= 1 << 31 else b for b in row] for row in rows]
    return _stable_from_bits(counts, rows)


@other("check_global_mean_var", "the total count read with .item(), the inputs checked")
def global_mean_var_item_count(counts, means, variances):
    if (variances < 0).any() or not torch.isfinite(means).all():
        raise ValueError("variances must be >= 0 and means finite")
    n = counts.sum().item()
    w = (counts / n)[:, None]
    mean = (w * means).sum(0)
    return mean, (w * (variances + (means - mean) ** 2)).sum(0)


@shortcut("check_global_mean_var", "E[x^2] - E[x]^2 in numpy float64", ".numpy()")
def global_mean_var_numpy64(counts, means, variances):
    c = counts.numpy().astype("float64")[:, None]
    m, v = means.numpy().astype("float64"), variances.numpy().astype("float64")
    n = c.sum()
    mean = (c * m).sum(0) / n
    return mean, (c * (v + m * m)).sum(0) / n - mean * mean


@shortcut("check_global_mean_var", "ignores the spread of the means", "leaves out how far")
def global_mean_var_within(counts, means, variances):
    n = counts.sum()
    return (counts[:, None] * means).sum(0) / n, (counts[:, None] * variances).sum(0) / n


@shortcut("check_global_mean_var", "unweighted mean", "weight each mean")
def global_mean_var_unweighted(counts, means, variances):
    mean = means.mean(0)
    return mean, (variances + (means - mean) ** 2).mean(0)


# ---- update_running_stats ----------------------------------------------------------------------
@worked("check_update_running_stats")
def update_running_stats(running_mean, running_var, mean, var, n, momentum):
    new_mean = (1 - momentum) * running_mean + momentum * mean
    new_var = (1 - momentum) * running_var + momentum * var * n / (n - 1)
    return new_mean, new_var


@other("check_update_running_stats", "lerp, lists")
def update_running_stats_lerp(running_mean, running_var, mean, var, n, momentum):
    return (torch.lerp(running_mean, mean, momentum).tolist(),
            torch.lerp(running_var, var * (n / (n - 1)), momentum).tolist())


@other("check_update_running_stats", "in place, as BatchNorm's own buffers, returned")
def update_running_stats_in_place(running_mean, running_var, mean, var, n, momentum):
    running_mean.lerp_(mean, momentum)
    running_var.lerp_(var * n / (n - 1), momentum)
    return running_mean, running_var


@shortcut("check_update_running_stats", "the biased variance", "unbiased one")
def update_running_stats_biased(running_mean, running_var, mean, var, n, momentum):
    return ((1 - momentum) * running_mean + momentum * mean,
            (1 - momentum) * running_var + momentum * var)


@shortcut("check_update_running_stats", "momentum the other way", "weight of the NEW")
def update_running_stats_flipped(running_mean, running_var, mean, var, n, momentum):
    return (momentum * running_mean + (1 - momentum) * mean,
            momentum * running_var + (1 - momentum) * var * n / (n - 1))


# ---- sync_bn_input_grad ------------------------------------------------------------------------
@worked("check_sync_bn_input_grad")
def sync_bn_input_grad(dy, x_hat, invstd, n):
    sums = torch.cat([dy.sum(0), (dy * x_hat).sum(0)])   # this rank's two per-channel sums
    dist.all_reduce(sums)                                 # summed over the ranks
    mean_dy, mean_dy_xhat = (sums / n).chunk(2)
    return invstd * (dy - mean_dy - x_hat * mean_dy_xhat)


@other("check_sync_bn_input_grad", "the row count all-reduced beside the sums (2c + 1 numbers)")
def sync_bn_input_grad_count_too(dy, x_hat, invstd, n):
    c = dy.shape[1]
    sums = torch.cat([dy.sum(0), (dy * x_hat).sum(0), torch.ones(1) * dy.shape[0]])
    dist.all_reduce(sums)
    return invstd * (dy - sums[:c] / sums[-1] - x_hat * sums[c:2 * c] / sums[-1])


@other("check_sync_bn_input_grad", "two all-reduces, einsum")
def sync_bn_input_grad_two(dy, x_hat, invstd, n):
    s1, s2 = dy.sum(0), torch.einsum("nc,nc->c", dy, x_hat)
    dist.all_reduce(s1)
    dist.all_reduce(s2)
    return invstd * (dy - s1 / n - x_hat * (s2 / n))


@shortcut("check_sync_bn_input_grad", "the two sums all-reduced in float16 (compressed)",
          "not the synchronised BatchNorm's")
def sync_bn_input_grad_half(dy, x_hat, invstd, n):
    sums = torch.cat([dy.sum(0), (dy * x_hat).sum(0)]).half()
    dist.all_reduce(sums)
    mean_dy, mean_dy_xhat = (sums.float() / n).chunk(2)
    return invstd * (dy - mean_dy - x_hat * mean_dy_xhat)


def test_float16_sums_fail_on_every_draw():
    """float16 sums lose digits the gradient shows on every draw (dY off zero per channel), not
    on about half of them; float32 sums pass on the same draws."""
    for seed in range(8):
        replay_seeds(seed)
        assert not helpers.checks.check_sync_bn_input_grad(sync_bn_input_grad_half).passed, seed
        replay_seeds(seed)
        assert helpers.checks.check_sync_bn_input_grad(sync_bn_input_grad).passed, seed


@shortcut("check_sync_bn_input_grad", "this rank's own means", "per-device BatchNorm")
def sync_bn_input_grad_local(dy, x_hat, invstd, n):
    return invstd * (dy - dy.mean(0) - x_hat * (dy * x_hat).mean(0))


@shortcut("check_sync_bn_input_grad", "all-gathers the rows", "never the rows")
def sync_bn_input_grad_gather(dy, x_hat, invstd, n):
    sizes = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([float(len(dy))]))
    width = int(max(s.item() for s in sizes))
    pad = torch.zeros(width - len(dy), dy.shape[1])
    rows = [torch.zeros(width, 2 * dy.shape[1]) for _ in sizes]
    dist.all_gather(rows, torch.cat([torch.cat([dy, dy * x_hat], 1), torch.cat([pad, pad], 1)]))
    total = torch.cat(rows).sum(0)
    c = dy.shape[1]
    return invstd * (dy - total[:c] / n - x_hat * total[c:] / n)


@shortcut("check_sync_bn_input_grad", "every row broadcast in small messages",
          "never the rows")
def sync_bn_input_grad_rows_broadcast(dy, x_hat, invstd, n):
    c, w = dy.shape[1], dist.get_world_size()
    sizes = [torch.tensor([float(len(dy))]) for _ in range(w)]
    for r in range(w):                          # 4 bytes each
        dist.broadcast(sizes[r], r)
    rows = []
    for r in range(w):                          # one row of dY and one of X_hat: c floats each
        for i in range(int(sizes[r].item())):
            pair = [dy[i].clone(), x_hat[i].clone()] if r == dist.get_rank() else [
                torch.empty(c), torch.empty(c)]
            for t in pair:
                dist.broadcast(t, r)
            rows.append(pair)
    all_dy = torch.stack([p[0] for p in rows])
    all_xh = torch.stack([p[1] for p in rows])
    dist.all_reduce(torch.zeros(2 * c))        # the all-reduce the check looks for
    return invstd * (dy - all_dy.mean(0) - x_hat * (all_dy * all_xh).mean(0))


@shortcut("check_sync_bn_input_grad", "averages the ranks' means", "SUMS over the ranks")
def sync_bn_input_grad_avg(dy, x_hat, invstd, n):
    means = torch.cat([dy.mean(0), (dy * x_hat).mean(0)])
    dist.all_reduce(means)
    m1, m2 = (means / dist.get_world_size()).chunk(2)
    return invstd * (dy - m1 - x_hat * m2)


test_case = parametrize_cases(__name__)
