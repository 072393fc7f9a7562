"""Checks for the exercises of Part III: DataParallel, custom modules, DDP with torchrun, BatchNorm.

Every check runs in this process on the CPU, on fresh random inputs; none starts a process group.
"""
import contextlib

import torch
from torch import nn

from ._core import CheckFailed, as_number, expect, fresh_generator, randint, run_check

__all__ = ["check_dp_shard_sizes", "check_lr_at", "check_strip_module_prefix",
           "check_accumulate_gradients",
           "check_global_mean_var", "check_dp_forward", "check_unused_parameters",
           "check_update_running_stats", "check_sync_bn_input_grads"]


def _int_list(value, call):
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    try:
        out = [int(v) for v in value]
    except (TypeError, ValueError):
        raise CheckFailed(f"{call} returned {value!r}, expected a list of ints")
    return out


# --- DataParallel -----------------------------------------------------------------------------
def check_dp_shard_sizes(fn):
    """fn(batch_size, k): the sizes of the pieces DataParallel's scatter (torch.chunk) makes."""

    def body(fn):
        g = fresh_generator()
        k = randint(g, 3, 8)
        cases = [(randint(g, 1, 70), randint(g, 2, 8)) for _ in range(6)]
        cases += [(k * randint(g, 2, 5) + 1, k), (k + 1, k)]   # e.g. 5 over 4: chunk makes 3 pieces
        for n, k in cases:
            call = f"dp_shard_sizes({n}, {k})"
            want = [len(c) for c in torch.arange(n).chunk(k)]
            got = _int_list(fn(n, k), call)
            if got == want:
                continue
            split = [len(c) for c in torch.arange(n).tensor_split(k)]
            hint = ""
            if got[:len(want)] == want and not any(got[len(want):]):   # the more specific one
                hint = (f": torch.chunk returns only {len(want)} pieces here, so "
                        f"{k - len(want)} GPU(s) get no piece at all (not an empty one)")
            elif got == split:
                hint = (": that is tensor_split; scatter uses torch.chunk (pieces of ceil(n/k) "
                        "rows, so maybe fewer than k pieces)")
            raise CheckFailed(f"{call} returned {got}, expected {want}{hint}")

    return run_check("dp_shard_sizes", body, fn)


def check_lr_at(fn):
    """fn(step, base_lr, base_batch, batch, warmup_steps): linear scaling plus linear warm-up."""

    def body(fn):
        g = fresh_generator()
        for case in range(4):
            base_lr = randint(g, 1, 20) / 100
            base_batch = 2 ** randint(g, 5, 8)
            batch = base_batch * randint(g, 2, 8)
            warmup = randint(g, 2, 12) if case == 0 else randint(g, 0, 12)
            peak = base_lr * batch / base_batch
            for step in range(warmup + 3):
                want = peak * min(1.0, (step + 1) / warmup) if warmup else peak
                call = f"lr_at({step}, {base_lr}, {base_batch}, {batch}, {warmup})"
                got = as_number(fn(step, base_lr, base_batch, batch, warmup), call)
                if abs(got - want) > 1e-9 * max(1, want):
                    if warmup and step < warmup and abs(got - peak) < 1e-9:
                        msg = "during the warm-up the rate must ramp up, not start at the peak"
                    elif abs(got - base_lr) < 1e-12 and batch != base_batch:
                        msg = "the rate must grow with the batch (linear scaling)"
                    elif warmup and abs(got - peak * step / warmup) < 1e-9:
                        msg = "off by one: step 0 is the first step and already gets 1/warmup"
                    else:
                        msg = f"expected {want:.6g}"
                    raise CheckFailed(f"{call} returned {got:.6g}: {msg}")

    return run_check("lr_at", body, fn)


# --- custom modules ---------------------------------------------------------------------------
def check_strip_module_prefix(fn):
    """fn(state_dict) -> a new dict whose keys lose ONE leading "module." (others untouched)."""

    def body(fn):
        g = fresh_generator()
        names = ["weight", "bias", "running_mean", "submodule.weight", "encoder.module.bias",
                 "modules.0.weight", "head.module_scale"]
        keys = [names[i] for i in torch.randperm(len(names), generator=g).tolist()]
        tensors = {k: torch.randn(2, generator=g) for k in keys}
        for wrapped in (True, False):
            sd = {("module." + k if wrapped else k): v for k, v in tensors.items()}
            before = dict(sd)
            got = fn(sd)
            expect(isinstance(got, dict), f"strip_module_prefix returned {type(got).__name__}, "
                                          "expected a dict")
            expect(sd == before and list(sd) == list(before),
                   "strip_module_prefix changed its argument: return a new dict")
            for k in keys:
                expect(k in got, f'key "{k}" is missing from the result (keys: {sorted(got)[:4]}'
                                 '...): strip only a LEADING "module.", once')
                expect(got[k] is tensors[k] or torch.equal(got[k], tensors[k]),
                       f'the tensor under "{k}" changed')
            expect(len(got) == len(keys), f"the result has {len(got)} keys, expected {len(keys)}")

    return run_check("strip_module_prefix", body, fn)


class _SyncRecorder(nn.Module):
    """A linear model with DDP's no_sync() interface: records, for each backward, whether the
    forward ran with gradient synchronisation on (DDP decides at forward time)."""

    def __init__(self, g):
        super().__init__()
        with torch.random.fork_rng(devices=[]):   # leave the notebook's random numbers alone
            self.lin = nn.Linear(5, 1)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(1, 5, generator=g))
        self.sync, self.backwards = True, []

    @contextlib.contextmanager
    def no_sync(self):
        old, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = old

    def forward(self, X):
        out, sync = self.lin(X), self.sync
        if out.requires_grad:
            out.register_hook(lambda grad: self.backwards.append(sync) or grad)
        return out


def check_accumulate_gradients(fn):
    """fn(model, loss_fn, micro_batches): gradients of the mean loss over all micro-batches,
    synchronising (leaving no_sync) only on the last backward."""

    def body(fn):
        g = fresh_generator()
        k = randint(g, 2, 5)
        micro = [(torch.randn(4, 5, generator=g), torch.randn(4, 1, generator=g)) for _ in range(k)]
        model, loss_fn = _SyncRecorder(g), nn.MSELoss()
        fn(model, loss_fn, micro)
        syncs = model.backwards
        expect(len(syncs) == k, f"{len(syncs)} backward passes for {k} micro-batches, expected {k}")
        expect(syncs[-1], "the last backward ran inside no_sync(): the gradients are never "
                          "all-reduced")
        expect(not any(syncs[:-1]), f"backward {syncs.index(True) + 1} of {k} synchronised: only "
                                    "the last one should (wrap the others in model.no_sync())")
        ref = _SyncRecorder(g)
        ref.load_state_dict(model.state_dict())
        X, y = torch.cat([m[0] for m in micro]), torch.cat([m[1] for m in micro])
        loss_fn(ref(X), y).backward()
        grad, want = model.lin.weight.grad, ref.lin.weight.grad
        expect(grad is not None, "no gradient on the model's weights")
        if torch.allclose(grad, want * k, atol=1e-5):
            raise CheckFailed(f"gradients are {k}x too large: divide each micro-batch's loss by "
                              f"the number of micro-batches ({k})")
        expect(torch.allclose(grad, want, atol=1e-5),
               "the accumulated gradient is not that of the mean loss over all micro-batches")

    return run_check("accumulate_gradients", body, fn)


def check_global_mean_var(fn):
    """fn(counts, means, variances) -> (mean, var): per-channel mean and biased variance of the
    global batch from what nn.SyncBatchNorm all-gathers, each rank's count and per-channel mean
    and biased variance (shapes (world_size,) and (world_size, channels), float32).

    The shards have a large mean and a small spread, as activations often do: rebuilding sums
    of squares and computing E[x^2] - E[x]^2 in float32 loses the variance to rounding and fails,
    as do ignoring the counts, ignoring the spread between the ranks' means, and the unbiased
    variance."""

    def body(fn):
        g = fresh_generator()
        w, c = randint(g, 2, 5), randint(g, 1, 6)
        offset = 2000 + 3000 * torch.rand(c, generator=g, dtype=torch.float64)
        shards = [torch.randn(randint(g, 1, 4) + 4 * i, c, generator=g, dtype=torch.float64)
                  * (0.5 + i) + offset + 3 * i for i in range(w)]
        counts = torch.tensor([float(len(s)) for s in shards])
        means = torch.stack([s.mean(0) for s in shards]).float()
        variances = torch.stack([s.var(0, unbiased=False) for s in shards]).float()
        n64, m64, v64 = counts.double(), means.double(), variances.double()
        want_mean = (n64[:, None] * m64).sum(0) / n64.sum()   # from the float32 inputs, exactly
        want_var = (n64[:, None] * (v64 + (m64 - want_mean) ** 2)).sum(0) / n64.sum()
        got = fn(counts.clone(), means.clone(), variances.clone())
        expect(isinstance(got, (tuple, list)) and len(got) == 2, "return (mean, var)")
        mean, var = (torch.as_tensor(t).double() for t in got)
        expect(mean.shape == (c,) and var.shape == (c,),
               f"mean and var should have shape ({c},), one value per channel")
        n = counts.sum()
        if not torch.allclose(mean, want_mean, rtol=1e-6, atol=1e-4):
            if torch.allclose(mean, m64.mean(0), rtol=1e-6, atol=1e-4):
                raise CheckFailed("mean is the average of the ranks' means: with shards of "
                                  "different sizes, weight each mean by its rank's count")
            raise CheckFailed("mean is not the global batch's mean (the count-weighted mean "
                              "of the ranks' means)")
        tol = dict(rtol=1e-5, atol=1e-5)
        if torch.allclose(var, want_var, **tol):
            return
        within = (counts[:, None].double() * v64).sum(0) / n
        if torch.allclose(var, within, **tol):
            raise CheckFailed("var is the count-weighted mean of the ranks' variances: it "
                              "leaves out how far each rank's mean lies from the global mean "
                              "(add count * (mean_r - mean)**2 for every rank)")
        if torch.allclose(var, want_var * n / (n - 1), **tol):
            raise CheckFailed("var is the unbiased variance: normalisation uses the biased one")
        sumsq = (counts[:, None] * (variances + means * means)).sum(0)   # float32, as given
        mean32 = (counts[:, None] * means).sum(0) / n
        naive = (sumsq / n - mean32 * mean32).double()
        worst = (var - want_var).abs().max().item()
        if (var - naive).abs().max() < (var - want_var).abs().max():
            raise CheckFailed(f"var is off by up to {worst:.3g}: E[x^2] - E[x]^2 subtracts two "
                              "numbers near mean**2 and float32 rounding eats the variance; "
                              "combine the ranks' variances and the spread of their means "
                              "instead (no squares of raw values)")
        raise CheckFailed("var is not the global batch's (biased) variance")

    return run_check("global_mean_var", body, fn)


# --- DataParallel by hand ---------------------------------------------------------------------
class _CallLog:
    """Shared by a module and all its deep copies: (replica id, rows) of every forward."""

    def __init__(self):
        self.calls = []

    def __deepcopy__(self, memo):
        return self


class _RecordingLinear(nn.Module):
    """A linear layer that logs which copy of it ran on how many rows."""

    def __init__(self, g, n_in, n_out, log):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            self.lin = nn.Linear(n_in, n_out)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(n_out, n_in, generator=g))
            self.lin.bias.copy_(torch.randn(n_out, generator=g))
        self.log = log

    def forward(self, X):
        self.log.calls.append((id(self), X.shape[0]))
        return self.lin(X)


def check_dp_forward(fn):
    """fn(net, X, devices) -> the outputs of one DataParallel-style forward: a replica of `net`
    per device, the batch cut with torch.chunk (as scatter does), each piece run by its own
    replica, the outputs gathered on devices[0] in order.

    The net logs which copy of it ran on how many rows: running the whole batch, cutting it
    with tensor_split, or running every piece on the original module fails."""

    def body(fn):
        g = fresh_generator()
        for _ in range(3):
            k = randint(g, 3, 4)   # with 2 devices chunk and tensor_split always agree
            n = randint(g, 2 * k + 1, 6 * k)
            while (len(torch.arange(n).chunk(k)) < k
                   or [len(c) for c in torch.arange(n).chunk(k)]
                   == [len(c) for c in torch.arange(n).tensor_split(k)]):
                n += 1   # a batch where the two ways of cutting differ
            n_in, n_out = randint(g, 2, 6), randint(g, 2, 5)
            log = _CallLog()
            net = _RecordingLinear(g, n_in, n_out, log)
            X = torch.randn(n, n_in, generator=g)
            with torch.no_grad():
                want = net.lin(X)
            devices = [torch.device("cpu")] * k
            what = f"dp_forward on a batch of {n} over {k} devices"
            out = fn(net, X, devices)
            expect(isinstance(out, torch.Tensor) and out.shape == want.shape,
                   f"{what} returned {type(out).__name__} "
                   f"{tuple(out.shape) if isinstance(out, torch.Tensor) else ''}, expected the "
                   f"gathered outputs of shape {tuple(want.shape)}")
            expect(torch.allclose(out.detach(), want, atol=1e-5),
                   f"{what}: the outputs differ from the module's on the whole batch: gather "
                   "the pieces' outputs in order (torch.cat)")
            rows = [r for _, r in log.calls]
            want_rows = [len(c) for c in torch.arange(n).chunk(k)]
            expect(rows != [n], f"{what}: the module ran once on all {n} rows; cut the batch "
                                "into one piece per device (torch.chunk) and run each piece")
            split_rows = [len(c) for c in torch.arange(n).tensor_split(k)]
            expect(sorted(rows) != sorted(split_rows) or split_rows == want_rows,
                   f"{what}: the pieces had {rows} rows, tensor_split's sizes; DataParallel's "
                   f"scatter uses torch.chunk: {want_rows}")
            expect(sorted(rows) == sorted(want_rows),
                   f"{what}: the pieces had {rows} rows, expected {want_rows} (torch.chunk)")
            replicas = [rid for rid, _ in log.calls]
            expect(id(net) not in replicas or len(set(replicas)) == k,
                   f"{what}: the original module ran {replicas.count(id(net))} of the pieces; "
                   "give every device its own replica (copy.deepcopy(net).to(device))")
            expect(len(set(replicas)) == k,
                   f"{what}: {len(set(replicas))} module copies ran the {k} pieces; each device "
                   "needs its own replica")

    return run_check("dp_forward", body, fn)


# --- parameters DDP must look for ---------------------------------------------------------------
class _TwoHeads(nn.Module):
    """A trunk and three heads: which heads a loss uses is up to the check."""

    def __init__(self, g):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            self.trunk, self.a, self.b, self.c = (nn.Linear(3, 4), nn.Linear(4, 2),
                                                  nn.Linear(4, 2), nn.Linear(4, 2))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))

    def forward(self, X, heads):
        h = torch.relu(self.trunk(X))
        return {name: getattr(self, name)(h) for name in heads}


def check_unused_parameters(fn):
    """fn(model, loss) -> the sorted names of `model`'s parameters that get no gradient from
    `loss`, found by walking the autograd graph as DDP's find_unused_parameters does: before any
    backward, without touching `.grad`.

    A parameter used with a zero weight (0 * head.sum()) gets a zero gradient but is used;
    answers that run backward, or compare gradients with zero, fail."""

    def body(fn):
        g = fresh_generator()
        for trial in range(3):
            model = _TwoHeads(g)
            X = torch.randn(randint(g, 2, 6), 3, generator=g)
            heads = ["a", "b", "c"]
            used = [h for h in heads if torch.rand((), generator=g) < 0.5] or ["a"]
            zero = [h for h in heads if h not in used][:1] if trial > 0 else []
            out = model(X, used + zero)
            loss = sum(out[h].pow(2).mean() for h in used)
            loss = loss + sum(0 * out[h].sum() for h in zero)
            want = sorted(name for name, _ in model.named_parameters()
                          if name.split(".")[0] not in used + zero + ["trunk"])
            what = f"unused_parameters with heads {used} in the loss" + (
                f" and head {zero[0]!r} with a zero weight" if zero else "")
            got = fn(model, loss)
            expect(all(p.grad is None for p in model.parameters()),
                   f"{what}: the parameters now have .grad: your function ran a backward "
                   "pass. DDP decides before backward, by walking loss.grad_fn (or use "
                   "torch.autograd.grad(..., allow_unused=True), which leaves .grad alone)")
            try:
                got = sorted(got)
            except TypeError:
                raise CheckFailed(f"{what}: returned {got!r}, expected a list of names")
            zero_names = sorted(n for n, _ in model.named_parameters()
                                if zero and n.startswith(zero[0] + "."))
            expect(not set(zero_names) & set(got),
                   f"{what}: you report {zero_names} as unused, but they take part (with a "
                   "zero weight): their gradient is zero, not missing. Walk the graph instead "
                   "of comparing gradients with zero")
            expect(got == want, f"{what}: returned {got}, expected {want}")

    return run_check("unused_parameters", body, fn)


# --- BatchNorm: running statistics and the synchronised backward --------------------------------
def check_update_running_stats(fn):
    """fn(running_mean, running_var, mean, var, n, momentum) -> the new (running_mean,
    running_var) of a BatchNorm after one training step whose batch had per-channel mean `mean`,
    biased variance `var` and n values per channel: the running variance takes the UNBIASED
    variance (var * n / (n - 1)), and `momentum` is the weight of the new value."""

    def body(fn):
        g = fresh_generator()
        c = randint(g, 2, 6)
        n = randint(g, 2, 12)
        momentum = [0.1, 0.25, 0.3][randint(g, 0, 2)]
        rm, rv = torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5
        X = torch.randn(n, c, generator=g) * 2 + 1
        mean, var = X.mean(0), X.var(0, unbiased=False)
        bn = nn.BatchNorm1d(c, momentum=momentum)
        with torch.no_grad():
            bn.running_mean.copy_(rm)
            bn.running_var.copy_(rv)
        bn(X)
        got = fn(rm.clone(), rv.clone(), mean.clone(), var.clone(), n, momentum)
        expect(isinstance(got, (tuple, list)) and len(got) == 2,
               "return (running_mean, running_var)")
        new_mean, new_var = (torch.as_tensor(t, dtype=torch.float32) for t in got)
        if not torch.allclose(new_mean, bn.running_mean, atol=1e-5):
            flipped = momentum * rm + (1 - momentum) * mean
            expect(not torch.allclose(new_mean, flipped, atol=1e-5),
                   f"running_mean: momentum {momentum} is the weight of the NEW batch mean "
                   "(PyTorch's convention), not of the old running value")
            expect(False, "running_mean is not (1 - momentum) * running_mean + momentum * mean")
        biased = (1 - momentum) * rv + momentum * var
        expect(not torch.allclose(new_var, biased, atol=1e-5),
               "running_var used the biased batch variance; BatchNorm stores the unbiased one "
               f"(var * n / (n - 1), here n = {n})")
        expect(torch.allclose(new_var, bn.running_var, atol=1e-5),
               "running_var is not (1 - momentum) * running_var + momentum * unbiased var")

    return run_check("update_running_stats", body, fn)


def check_sync_bn_input_grads(fn):
    """fn(dys, x_hats, invstd) -> one input gradient per rank for a synchronised BatchNorm
    (weight 1): dX_r = invstd * (dY_r - mean(dY) - X_hat_r * mean(dY * X_hat)), the means taken
    over the GLOBAL batch, i.e. from per-channel sums all-reduced over the ranks and divided by
    the global count. dys[r] and x_hats[r] have shape (n_r, channels); ranks differ in n_r."""

    def body(fn):
        g = fresh_generator()
        w, c = randint(g, 2, 4), randint(g, 1, 4)
        rows = [randint(g, 2, 6) + 3 * r for r in range(w)]
        X = torch.randn(sum(rows), c, generator=g, dtype=torch.float64) * 2 + 1
        dY = torch.randn(sum(rows), c, generator=g, dtype=torch.float64)
        Xg = X.clone().requires_grad_()
        mean, var = Xg.mean(0), Xg.var(0, unbiased=False)
        invstd = torch.rsqrt(var + 1e-5)
        ((Xg - mean) * invstd * dY).sum().backward()
        want = Xg.grad.split(rows)
        x_hat = ((X - X.mean(0)) * torch.rsqrt(X.var(0, unbiased=False) + 1e-5))
        dys, x_hats = list(dY.split(rows)), list(x_hat.split(rows))
        got = fn([d.clone() for d in dys], [x.clone() for x in x_hats], invstd.detach().clone())
        expect(isinstance(got, (list, tuple)) and len(got) == w,
               f"return one gradient per rank ({w} ranks)")
        got = [torch.as_tensor(t, dtype=torch.float64) for t in got]
        expect(all(t.shape == d.shape for t, d in zip(got, dys)),
               "each rank's gradient has the shape of its dY")
        if all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want)):
            return
        local = [invstd * (d - d.mean(0) - x * (d * x).mean(0)) for d, x in zip(dys, x_hats)]
        expect(not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, local)),
               "you used each rank's own means of dY and dY * X_hat: that is per-device "
               "BatchNorm's gradient. All-reduce (sum) the per-channel sums over the ranks and "
               "divide by the global count")
        m1 = torch.stack([d.mean(0) for d in dys]).mean(0)
        m2 = torch.stack([(d * x).mean(0) for d, x in zip(dys, x_hats)]).mean(0)
        avg = [invstd * (d - m1 - x * m2) for d, x in zip(dys, x_hats)]
        expect(not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, avg)),
               "you averaged the ranks' means: ranks hold different numbers of rows, so add "
               "the SUMS over the ranks, then divide by the global count")
        expect(False, "the gradients are not the synchronised BatchNorm's input gradients")

    return run_check("sync_bn_input_grads", body, fn)
