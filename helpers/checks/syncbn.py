"""Checks for the exercises of the BatchNorm-across-devices chapter (Part III).

The statistics exercise runs with the Recorder watching (the dtype of every operation: the
exercise is about float32, where E[x^2] - E[x]^2 fails); the synchronised backward runs on the
harness's World, every rank a thread, and what travels between the ranks is recorded.
"""
import torch
from torch import nn

from ._core import (
    CheckFailed,
    Recorder,
    World,
    check,
    expect,
    fresh_generator,
    randint,
    storage_key,
    tensor_close,
    uniform,
)
from ._core.exits import watch_exits

__all__ = ["check_global_mean_var", "check_update_running_stats", "check_sync_bn_input_grad"]

_FLAGS = 8          # true/false elements an answer may read from the statistics (its branches)
_DTYPE, _NUMEL = torch._C.TensorBase.dtype.__get__, torch._C.TensorBase.numel


@check("global_mean_var", references=["SyncBatchNormFunction", "CPUSyncBatchNorm", "combine_stats",
                                      "torch.nn.modules._functions.SyncBatchNorm.forward"],
       observes=[
    "the mean and biased variance returned for float32 shards of unequal sizes with a large mean "
    "and a small spread (where E[x^2] - E[x]^2 loses the variance), against the exact values; "
    "one channel where every rank's mean is the same power of two, 2**30 or more, where "
    "E[x^2] - E[x]^2 loses the variance in any precision (Python floats, numpy, float64)",
    "the dtype of every operation the answer ran: float32 only (float64 would hide the "
    "rounding the exercise is about)",
    "whether the answer read the means or variances out of torch (.item(), float(), .tolist(), "
    ".numpy(), np.asarray, pickling, printing), or any tensor computed from them whatever its "
    "dtype (their bits through an integer copy), but a few true/false flags: Python floats are "
    "float64, fractions exact, and numpy's precision is out of the check's sight; computing in "
    "float32 torch is the exercise"])
def check_global_mean_var(fn):
    """fn(counts, means, variances) -> (mean, var): per-channel mean and biased variance of the
    global batch from each rank's count and per-channel mean and biased variance (shapes
    (world_size,) and (world_size, channels), float32), computed in float32."""
    g = fresh_generator()
    w, c = randint(g, 2, 5), randint(g, 1, 6)
    sizes = [randint(g, 1, 4) + 4 * i for i in range(w)]
    sizes[-1] += 2 ** (sum(sizes) - 1).bit_length() - sum(sizes)   # n a power of two
    offset = 2000 + 3000 * torch.rand(c, generator=g, dtype=torch.float64)
    shards = [torch.randn(k, c + 1, generator=g, dtype=torch.float64) * (0.5 + i)
              + torch.cat([offset + 3 * i, torch.zeros(1, dtype=torch.float64)])
              for i, k in enumerate(sizes)]
    counts = torch.tensor([float(k) for k in sizes])
    means = torch.stack([s.mean(0) for s in shards]).float()
    variances = torch.stack([s.var(0, unbiased=False) for s in shards]).float()
    # one more channel where every rank's mean is the same power of two, 2**30 or more: a stable
    # float32 combination is exact there (mean and weights are exact, no spread of the means),
    # but E[x^2] - E[x]^2 loses the variance in ANY precision (float64, Python floats, numpy),
    # since the spread (about 1) is below the rounding of mean**2 (2**60 or more)
    exact = randint(g, 0, c)
    order = [j for j in range(c + 1) if j != c]
    order.insert(exact, c)
    means[:, c] = float(2 ** randint(g, 30, 40))
    means, variances = means[:, order].contiguous(), variances[:, order].contiguous()
    c += 1
    given = (counts.clone(), means.clone(), variances.clone())
    exits = []                           # what left torch without an aten operation (exits.py)
    with Recorder() as rec, watch_exits(lambda t, how: exits.append(   # TensorBase's getters
            (storage_key(t), how, _DTYPE(t) == torch.bool, _NUMEL(t)))):
        got = fn(*given)
    read = _read_into_python(rec, exits, given[1:])
    printed = (" A print of them counts too: its digits are their values, which code could "
               "parse back; remove the print, or print their shapes.") if "repr" in read else ""
    expect(not read, f"your code read the ranks' means or variances out of torch into Python "
                     f"numbers or numpy ({read}): Python floats are float64, fractions exact, and "
                     "neither is the float32 this exercise combines in; keep them in float32 "
                     f"tensors and combine them so that float32 suffices.{printed}")
    n64, m64, v64 = counts.double(), means.double(), variances.double()
    want_mean = (n64[:, None] * m64).sum(0) / n64.sum()   # from the float32 inputs, exactly
    want_var = (n64[:, None] * (v64 + (m64 - want_mean) ** 2)).sum(0) / n64.sum()
    wide = sorted({op.name for op in rec.ops
                   if any(r.dtype == torch.float64 for r in op.reads + op.writes + op.outputs)})
    expect(not wide, f"your code computed in float64 ({', '.join(wide[:4])}): the exercise is "
                     "about float32, the precision BatchNorm works in; combine the ranks' "
                     "statistics so that float32 suffices (no squares of raw values)")
    expect(isinstance(got, (tuple, list)) and len(got) == 2, "return (mean, var)")
    mean, var = (torch.as_tensor(t).double() for t in got)
    expect(mean.shape == (c,) and var.shape == (c,),
           f"mean and var should have shape ({c},), one value per channel")
    n = counts.sum()
    if not tensor_close(mean, want_mean, rtol=1e-6, atol=1e-4, what="mean"):
        expect(not tensor_close(mean, m64.mean(0), rtol=1e-6, atol=1e-4),
               "mean is the average of the ranks' means: with shards of different sizes, weight "
               "each mean by its rank's count")
        raise CheckFailed("mean is not the global batch's mean (the count-weighted mean of the "
                          "ranks' means)")
    # a stable combination in float32 errs by a few roundings: the one-pass formula around the
    # global mean by ~1e-7 relative, a pairwise (Chan) merge rank by rank by up to ~1e-4 (its
    # delta = mean_b - mean_a carries mean_a's rounding); E[x^2] - E[x]^2 by about u * mean**2,
    # ~1e-1 relative here: the tolerance stays 100x below it
    tol = dict(rtol=1e-3, atol=1e-5)
    if tensor_close(var, want_var, **tol, what="var"):
        return
    rest = [j for j in range(c) if j != exact]
    expect(not tensor_close(var[rest], want_var[rest], **tol),
           f"var is off in channel {exact}, where every rank's mean is {means[0, exact]:.6g} and "
           f"the variance {want_var[exact]:.3g}: E[x^2] - E[x]^2 loses the variance there in any "
           "precision (float64 and Python floats too); combine the ranks' variances and the "
           "spread of their means instead (no squares of raw values)")
    within = (counts[:, None].double() * v64).sum(0) / n
    expect(not tensor_close(var, within, **tol),
           "var is the count-weighted mean of the ranks' variances: it leaves out how far each "
           "rank's mean lies from the global mean (add count * (mean_r - mean)**2 for every rank)")
    expect(not tensor_close(var, want_var * n / (n - 1), **tol),
           "var is the unbiased variance: normalisation uses the biased one")
    sumsq = (counts[:, None] * (variances + means * means)).sum(0)   # float32, as given
    mean32 = (counts[:, None] * means).sum(0) / n
    naive = (sumsq / n - mean32 * mean32).double()
    worst = (var - want_var).abs().max().item()
    expect((var - naive).abs().max() >= (var - want_var).abs().max(),
           f"var is off by up to {worst:.3g}: E[x^2] - E[x]^2 subtracts two numbers near "
           "mean**2 and float32 rounding eats the variance; combine the ranks' variances and "
           "the spread of their means instead (no squares of raw values)")
    raise CheckFailed("var is not the global batch's (biased) variance")


def _read_into_python(rec, exits, tensors):
    """How the answer read values computed from `tensors` out of torch (.item(), float(),
    .tolist(), .numpy(), np.asarray, print ...: exits.py), or "" if it did not: any storage
    descended from them, whatever its dtype (a float's bits read through an integer copy count),
    but a few true/false flags (`if (var < 0).any()`) may be read."""
    keys = {storage_key(t) for t in tensors}
    how, flags = [], 0
    for op in rec.ops:
        if any(r.key in keys for r in op.reads):
            if op.name == "_local_scalar_dense":
                if op.reads[0].dtype == torch.bool:
                    flags += 1
                else:
                    how.append(".item() or float()")
            keys |= {r.key for r in op.outputs + op.writes}
    for key, name, is_flag, numel in exits:
        if key in keys:
            flags += numel if is_flag else 0
            how += [] if is_flag else [name]
    how += [f"{flags} true/false flags"] if flags > _FLAGS else []
    return " and ".join(sorted(set(how)))


@check("update_running_stats", changes_inputs=True, observes=[     # BatchNorm's is in place
    "the running mean and variance returned (updated in place or new) for fresh statistics and "
    "momenta, against what nn.BatchNorm1d stores after the same training step"])
def check_update_running_stats(fn):
    """fn(running_mean, running_var, mean, var, n, momentum) -> the new (running_mean,
    running_var) of a BatchNorm after one training step whose batch had per-channel mean `mean`,
    biased variance `var` and n values per channel: the running variance takes the UNBIASED
    variance (var * n / (n - 1)), and `momentum` is the weight of the new value."""
    g = fresh_generator()
    for _ in range(2):
        c, n = randint(g, 2, 6), randint(g, 2, 12)
        # never 0.5: there the flipped convention (momentum weighing the old value) agrees
        momentum = [0.1, 0.25, 0.3, 0.75][randint(g, 0, 3)]
        rm, rv = torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5
        X = torch.randn(n, c, generator=g) * 2 + 1
        mean, var = X.mean(0), X.var(0, unbiased=False)
        got = fn(rm.clone(), rv.clone(), mean.clone(), var.clone(), n, momentum)
        bn = nn.BatchNorm1d(c, momentum=momentum)     # the expected values: after the call
        with torch.no_grad():
            bn.running_mean.copy_(rm)
            bn.running_var.copy_(rv)
        bn(X)
        expect(isinstance(got, (tuple, list)) and len(got) == 2,
               "return (running_mean, running_var)")
        new_mean, new_var = (torch.as_tensor(t, dtype=torch.float32) for t in got)
        if not tensor_close(new_mean, bn.running_mean, atol=1e-5, what="running_mean"):
            flipped = momentum * rm + (1 - momentum) * mean
            expect(not tensor_close(new_mean, flipped, atol=1e-5),
                   f"running_mean: momentum {momentum} is the weight of the NEW batch mean "
                   "(PyTorch's convention), not of the old running value")
            raise CheckFailed("running_mean is not (1 - momentum) * running_mean + momentum * "
                              "mean")
        biased = (1 - momentum) * rv + momentum * var
        expect(not tensor_close(new_var, biased, atol=1e-5, what="running_var"),
               "running_var used the biased batch variance; BatchNorm stores the unbiased one "
               f"(var * n / (n - 1), here n = {n})")
        expect(tensor_close(new_var, bn.running_var, atol=1e-5, what="running_var"),
               "running_var is not (1 - momentum) * running_var + momentum * unbiased var")


@check("sync_bn_input_grad", references=["SyncBatchNormFunction",
                                         "torch.nn.modules._functions.SyncBatchNorm.backward"],
       observes=[
    "on a World of 2-4 thread ranks holding different numbers of rows: every call each rank "
    "made and how many numbers it sent in all (the two per-channel sums at most, and the row "
    "count if it likes, in float32 or wider: each channel's dY is off zero, so float16 sums "
    "lose digits that show in the gradient), over 2-4 channels",
    "each rank's input gradient against autograd's for one BatchNorm over the whole global "
    "batch"])
def check_sync_bn_input_grad(fn):
    """fn(dy, x_hat, invstd, n) on every rank: this rank's input gradient of a synchronised
    BatchNorm (weight 1), dX = invstd * (dY - mean(dY) - X_hat * mean(dY * X_hat)), the means
    over the GLOBAL batch of n rows per channel, from per-channel sums all-reduced over the ranks
    (only 2 values per channel travel)."""
    g = fresh_generator()
    w, c = randint(g, 2, 4), randint(g, 2, 4)    # two channels or more: sums per channel show
    rows = [randint(g, 2, 6) + 3 * r for r in range(w)]
    X = torch.randn(sum(rows), c, generator=g) * 2 + 1
    # each channel's dY off zero by 4 to 16 (a loss that pushes one way): its sum, hundreds,
    # keeps float32's digits but not float16's (spacing 0.125 to 0.5), which then shows
    offset = torch.tensor([uniform(g, 4, 16) * (-1) ** randint(g, 0, 1) for _ in range(c)])
    dY = torch.randn(sum(rows), c, generator=g) + offset
    invstd = torch.rsqrt(X.var(0, unbiased=False) + 1e-5)
    x_hat = (X - X.mean(0)) * invstd
    dys, x_hats = dY.split(rows), x_hat.split(rows)
    world = World(w, record_ops=True, allow={"all_reduce"}, why=dict.fromkeys(
        ("all_gather", "broadcast", "send", "reduce_scatter", "all_to_all"), "only the two "
        "per-channel sums need to travel, all-reduced, never the rows"))

    # each rank's own copies, made here: what flows into them is making the inputs
    given = [(dys[r].clone(), x_hats[r].clone(), invstd.clone()) for r in range(w)]

    def rank_fn(comm):
        return fn(*given[comm.rank], sum(rows))
    got = world.run(rank_fn)
    for r in range(w):     # in total, not per message: many small messages carry rows too
        sent = world.traffic(r)
        total = sent.numbers()       # numbers, not bytes: float64 sums are fine
        expect(total <= 2 * c + 1,       # the row count beside them is redundant, not wrong
               f"rank {r} sent {total} numbers ({sent.payload_bytes()} bytes) in {len(sent)} "
               f"call(s): only the two per-channel sums ({2 * c} numbers) need to travel, "
               "never the rows")
    expect(world.sent("all_reduce"),
           "no all_reduce: each rank used only its own rows, which is per-device BatchNorm's "
           "gradient; all-reduce (sum) the per-channel sums of dY and dY * X_hat over the ranks")
    Xg = X.clone().requires_grad_()         # the expected gradients, after the answer ran
    mean, var = Xg.mean(0), Xg.var(0, unbiased=False)
    ((Xg - mean) * torch.rsqrt(var + 1e-5) * dY).sum().backward()
    want = Xg.grad.split(rows)
    for r in range(w):
        t = got[r]
        expect(isinstance(t, torch.Tensor) and t.shape == dys[r].shape,
               f"rank {r} returned {type(t).__name__}, expected its input gradient of shape "
               f"{tuple(dys[r].shape)}")
        # float32 sums stay within 15 % of this tolerance, float16 ones exceed it 8-fold or more
        if tensor_close(t, want[r], atol=2e-5, rtol=2e-5, what=f"rank {r}'s input gradient"):
            continue
        m1 = torch.stack([d.mean(0) for d in dys]).mean(0)
        m2 = torch.stack([(d * x).mean(0) for d, x in zip(dys, x_hats, strict=True)]).mean(0)
        avg = invstd * (dys[r] - m1 - x_hats[r] * m2)
        expect(not tensor_close(t, avg, atol=1e-4, rtol=1e-4),
               "you averaged the ranks' means: ranks hold different numbers of rows, so add the "
               "SUMS over the ranks, then divide by the global count n")
        raise CheckFailed(f"rank {r}'s gradient is not the synchronised BatchNorm's input "
                          "gradient")
    for r in range(w):
        world.expect_from_messages(r, got[r], "input gradient", w)
