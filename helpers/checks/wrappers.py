"""Checks for the exercises of Part III's DataParallel and custom-modules chapters.

Sizes and formulas are judged on fresh inputs with the Recorder watching (an answer that splits
a tensor to measure the pieces ran torch operations); DataParallel by hand runs once on CPU
tensors for the values and once on simulated GPUs (FakeGPUs) for where every replica, piece and
output lived; accumulation and the graph walk are judged by what autograd actually ran.
"""
import contextlib

import torch
from torch import nn

from ._core import (CheckFailed, FakeGPUs, Recorder, as_number, check, describe_device, expect,
                    fresh_generator, randint)
from ._core.references import Reference, scan

__all__ = ["check_dp_shard_sizes", "check_lr_at", "check_dp_forward", "check_strip_module_prefix",
           "check_accumulate_gradients", "check_unused_parameters"]


def _int_list(value, call):
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError):
        raise CheckFailed(f"{call} returned {value!r}, expected a list of ints") from None


def _forbid(fn, exercise, objects):
    """Refuse an answer whose code reaches one of `objects` ({dotted name: object}), by
    identity (a name bound earlier counts too): the exercise asks to write it."""
    class Named(Reference):
        def __repr__(self):
            return self.name
    try:
        scan(getattr(fn, "fn", fn), [Named(n, o) for n, o in objects.items()], exercise)
    except CheckFailed as e:
        name = next((n for n in objects if n in str(e)), None)
        if name is None:
            raise
        raise CheckFailed(f"the exercise asks you to write {exercise} yourself; your code uses "
                          f"{name}, which does it for you") from None


# --- DataParallel -----------------------------------------------------------------------------
@check("dp_shard_sizes", observes=[
    "the sizes returned for fresh (batch, k), including batches that leave GPUs without a "
    "piece, against torch.chunk's",
    "every torch operation the answer ran (the sizes must come from arithmetic, not from "
    "chunking a tensor and measuring it)"])
def check_dp_shard_sizes(fn):
    """fn(batch_size, k): the sizes of the pieces DataParallel's scatter (torch.chunk) makes."""
    g = fresh_generator()
    k = randint(g, 3, 8)
    cases = [(randint(g, 1, 70), randint(g, 2, 8)) for _ in range(6)]
    cases += [(k * randint(g, 2, 5) + 1, k), (k + 1, k)]   # e.g. 5 over 4: chunk makes 3 pieces
    cases.append((randint(g, 10**6, 10**9), randint(g, 2, 8)))  # beyond any table built ahead
    for n, k in cases:
        call = f"dp_shard_sizes({n}, {k})"
        with Recorder() as rec:
            value = fn(n, k)
        size = -(-n // k)                       # torch.chunk's arithmetic, for any n
        want = [size] * (-(-n // size) - 1) + [n - size * (-(-n // size) - 1)]
        ops = sorted({op.name for op in rec.ops})
        expect(not ops, f"{call}: your code built and cut a tensor ({', '.join(ops)}) to "
                        "measure the pieces: work the sizes out with arithmetic, as the exercise "
                        "asks (no torch.chunk)")
        got = _int_list(value, call)
        if got == want:
            continue
        split = [n // k + (i < n % k) for i in range(k)]
        hint = ""
        if got[:len(want)] == want and not any(got[len(want):]):
            hint = (f": torch.chunk returns only {len(want)} pieces here, so {k - len(want)} "
                    "GPU(s) get no piece at all (not an empty one)")
        elif got == split:
            hint = (": that is tensor_split; scatter uses torch.chunk (pieces of ceil(n/k) rows, "
                    "so maybe fewer than k pieces)")
        raise CheckFailed(f"{call} returned {got}, expected {want}{hint}")


@check("lr_at", observes=["the rate returned at every step of fresh warm-ups (0 included) and "
                          "batch ratios, any real number type, to 1e-9 relative"])
def check_lr_at(fn):
    """fn(step, base_lr, base_batch, batch, warmup_steps): linear scaling plus linear warm-up."""
    g = fresh_generator()
    for case in range(4):
        base_lr = randint(g, 1, 20) / 100
        base_batch = 2 ** randint(g, 5, 8)
        batch = base_batch * randint(g, 2, 8)
        warmup = randint(g, 2, 12) if case == 0 else 0 if case == 1 else randint(g, 0, 12)
        peak = base_lr * batch / base_batch
        for step in range(warmup + 3):
            want = peak * min(1.0, (step + 1) / warmup) if warmup else peak
            call = f"lr_at({step}, {base_lr}, {base_batch}, {batch}, {warmup})"
            got = as_number(fn(step, base_lr, base_batch, batch, warmup), call)
            if abs(got - want) <= 1e-9 * max(1, want):
                continue
            if warmup and step < warmup and abs(got - peak) < 1e-9:
                msg = "during the warm-up the rate must ramp up, not start at the peak"
            elif abs(got - base_lr * min(1.0, (step + 1) / max(warmup, 1))) < 1e-12 \
                    or abs(got - base_lr) < 1e-12:
                msg = "the rate must grow with the batch (linear scaling)"
            elif warmup and abs(got - peak * step / warmup) < 1e-9:
                msg = "off by one: step 0 is the first step and already gets 1/warmup"
            else:
                msg = f"expected {want:.6g}"
            raise CheckFailed(f"{call} returned {got:.6g}: {msg}")


class _CallLog:
    """Shared by a module and all its deep copies: (replica id, rows, device) of every forward."""

    def __init__(self):
        self.calls, self.keep = [], []

    def __deepcopy__(self, memo):
        return self


class _RecordingLinear(nn.Module):
    """A linear layer that logs which copy of it ran on how many rows, and where."""

    def __init__(self, g, n_in, n_out, log):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            self.lin = nn.Linear(n_in, n_out)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(n_out, n_in, generator=g))
            self.lin.bias.copy_(torch.randn(n_out, generator=g))
        self.log = log

    def forward(self, X):
        self.log.keep.append(self)        # alive, so no later copy gets its id()
        self.log.calls.append((id(self), X.shape[0], X.device, self.lin.weight.device))
        return self.lin(X)


def _dp_case(g):
    k = randint(g, 3, 4)   # with 2 devices chunk and tensor_split always agree
    n = randint(g, 2 * k + 1, 6 * k)
    while (len(torch.arange(n).chunk(k)) < k or [len(c) for c in torch.arange(n).chunk(k)]
           == [len(c) for c in torch.arange(n).tensor_split(k)]):
        n += 1   # a batch where the two ways of cutting differ
    return k, n, randint(g, 2, 6), randint(g, 2, 5)


@check("dp_forward", observes=[
    "on CPU: the outputs against the module's on the whole batch, and which copy of the module "
    "ran on how many rows (the check's module logs every call, deep copies included)",
    "on k simulated GPUs: the device of every replica's weights and of every piece it ran on, "
    "and of the gathered output (no operation may mix devices)"])
def check_dp_forward(fn):
    """fn(net, X, devices) -> the outputs of one DataParallel-style forward: a replica of `net`
    per device, the batch cut with torch.chunk (as scatter does), each piece run by its own
    replica on its device, the outputs gathered on devices[0] in order."""
    g = fresh_generator()
    for _ in range(2):
        k, n, n_in, n_out = _dp_case(g)
        log = _CallLog()
        net = _RecordingLinear(g, n_in, n_out, log)
        X = torch.randn(n, n_in, generator=g)
        with torch.no_grad():
            want = net.lin(X)
        what = f"dp_forward on a batch of {n} over {k} devices"
        out = fn(net, X, [torch.device("cpu")] * k)
        expect(isinstance(out, torch.Tensor) and out.shape == want.shape,
               f"{what} returned {type(out).__name__} "
               f"{tuple(out.shape) if isinstance(out, torch.Tensor) else ''}, expected the "
               f"gathered outputs of shape {tuple(want.shape)}")
        expect(torch.allclose(out.detach(), want, atol=1e-5),
               f"{what}: the outputs differ from the module's on the whole batch: gather the "
               "pieces' outputs in order (torch.cat)")
        rows = [r for _, r, _, _ in log.calls]
        want_rows = [len(c) for c in torch.arange(n).chunk(k)]
        expect(rows != [n], f"{what}: the module ran once on all {n} rows; cut the batch into "
                            "one piece per device (torch.chunk) and run each piece")
        split_rows = [len(c) for c in torch.arange(n).tensor_split(k)]
        expect(sorted(rows) != sorted(split_rows), f"{what}: the pieces had {rows} rows, "
               f"tensor_split's sizes; DataParallel's scatter uses torch.chunk: {want_rows}")
        expect(sorted(rows) == sorted(want_rows),
               f"{what}: the pieces had {rows} rows, expected {want_rows} (torch.chunk)")
        replicas = [rid for rid, _, _, _ in log.calls]
        expect(id(net) not in replicas, f"{what}: the original module ran "
               f"{replicas.count(id(net))} of the pieces; give every device its own replica "
               "(copy.deepcopy(net).to(device))")
        expect(len(set(replicas)) == k, f"{what}: {len(set(replicas))} module copies ran the "
                                        f"{k} pieces; each device needs its own replica")
    _placement(fn, g)


def _placement(fn, g):
    k, n, n_in, n_out = _dp_case(g)
    gpus = FakeGPUs(k)
    log = _CallLog()
    net = _RecordingLinear(g, n_in, n_out, log)
    X = gpus.tensor(torch.randn(n, n_in), 0)              # the batch arrives on GPU 0
    what = f"dp_forward over {k} simulated GPUs"
    out, _ = gpus.run(fn, net, X, list(gpus.devices), what=what)
    used = sorted({(str(x), str(w)) for _, _, x, w in log.calls})
    where = sorted({str(x) for _, _, x, _ in log.calls})
    expect(len(where) == k, f"{what}: the pieces ran on {', '.join(where)}: move piece i and "
                            "replica i to devices[i] (copy.deepcopy(net).to(d), x.to(d))")
    expect(all(x == w for x, w in used), f"{what}: a replica's weights and its piece were on "
                                         f"different devices ({used})")
    expect(isinstance(out, torch.Tensor) and out.device == gpus.devices[0],
           f"{what}: the gathered output is on "
           f"{describe_device(out.device) if isinstance(out, torch.Tensor) else 'no device'}; "
           "gather the outputs on devices[0]")


# --- custom modules ---------------------------------------------------------------------------
@check("strip_module_prefix", references=["load_checkpoint"], observes=[
    "the dict returned for keys with and without a leading 'module.', names that merely contain "
    "'module', and the argument left unchanged",
    "by identity: neither helpers.load_checkpoint nor torch's "
    "consume_prefix_in_state_dict_if_present (which do it for you)"])
def check_strip_module_prefix(fn):
    """fn(state_dict) -> a new dict whose keys lose ONE leading "module." (others untouched)."""
    from torch.nn.modules import utils
    _forbid(fn, "strip_module_prefix", {
        "torch.nn.modules.utils.consume_prefix_in_state_dict_if_present":
            utils.consume_prefix_in_state_dict_if_present})
    g = fresh_generator()
    names = ["weight", "bias", "running_mean", "submodule.weight", "encoder.module.bias",
             "modules.0.weight", "head.module_scale", "module.inner.weight"]
    keys = [names[i] for i in torch.randperm(len(names), generator=g).tolist()]
    tensors = {k: torch.randn(2, generator=g) for k in keys}
    for wrapped in (True, False):
        sd = {("module." + k if wrapped else k): v for k, v in tensors.items()}
        if not wrapped:   # a key that only starts with "module." once, of the model's own
            sd = {k: v for k, v in sd.items() if not k.startswith("module.")}
        before = dict(sd)
        saved, utils.consume_prefix_in_state_dict_if_present = (
            utils.consume_prefix_in_state_dict_if_present, _refuse_consume)
        try:
            got = fn(sd)
        finally:
            utils.consume_prefix_in_state_dict_if_present = saved
        expect(isinstance(got, dict), f"strip_module_prefix returned {type(got).__name__}, "
                                      "expected a dict")
        expect(sd == before and list(sd) == list(before),
               "strip_module_prefix changed its argument: return a new dict")
        want = {k[len("module."):] if k.startswith("module.") else k: v for k, v in sd.items()}
        for k in want:
            expect(k in got, f'key "{k}" is missing from the result (keys: {sorted(got)[:4]}...):'
                             ' strip only a LEADING "module.", once')
            expect(got[k] is want[k] or torch.equal(got[k], want[k]),
                   f'the tensor under "{k}" changed')
        expect(len(got) == len(want), f"the result has {len(got)} keys, expected {len(want)}")


def _refuse_consume(*args, **kwargs):
    raise CheckFailed("the exercise asks you to write strip_module_prefix yourself; your code "
                      "called torch's consume_prefix_in_state_dict_if_present, which does it "
                      "for you")


class _SyncRecorder(nn.Module):
    """A linear model with DDP's no_sync() interface: records, for each micro-batch's output,
    whether its forward ran with synchronisation on (DDP decides at forward time) and in which
    backward pass (a callback queued on the autograd engine ends each one) its gradient flowed."""

    def __init__(self, g):
        super().__init__()
        with torch.random.fork_rng(devices=[]):   # leave the notebook's random numbers alone
            self.lin = nn.Linear(5, 1)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(1, 5, generator=g))
        self.sync, self.outputs, self.passes, self._queued = True, [], 0, False
        self.rows = []                      # (rows, gradient non-zero) of every output

    @contextlib.contextmanager
    def no_sync(self):
        old, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = old

    def _end_of_backward(self):
        self.passes += 1
        self._queued = False

    def forward(self, X):
        out, sync = self.lin(X), self.sync
        if out.requires_grad:
            def seen(grad):
                if not self._queued:
                    self._queued = True
                    torch.autograd.Variable._execution_engine.queue_callback(
                        self._end_of_backward)
                self.outputs.append((sync, self.passes))
                self.rows.append((grad.shape[0], bool(grad.detach().abs().sum() > 0)))
                return grad
            out.register_hook(seen)
        return out


@check("accumulate_gradients", observes=[
    "a stand-in model with DDP's no_sync(): for every micro-batch's output, whether its forward "
    "ran synchronised and in which backward pass (counted on the autograd engine) its gradient "
    "flowed",
    "the gradients left, for micro-batches of unequal sizes, against the gradient of the mean "
    "loss over all their examples"])
def check_accumulate_gradients(fn):
    """fn(model, loss_fn, micro_batches): the gradient of the mean loss over all the examples of
    the micro-batches (of unequal sizes), one backward per micro-batch, synchronising (outside
    no_sync) only on the last."""
    g = fresh_generator()
    k = randint(g, 2, 5)
    sizes = [randint(g, 2, 7) for _ in range(k)]
    if len(set(sizes)) == 1:
        sizes[-1] += 2                                  # the last micro-batch shorter or longer
    micro = [(torch.randn(s, 5, generator=g), torch.randn(s, 1, generator=g)) for s in sizes]
    model, loss_fn = _SyncRecorder(g), nn.MSELoss()
    fn(model, loss_fn, micro)
    outs = model.outputs
    expect(len(outs) == k, f"{len(outs)} micro-batch outputs took part in backward, for {k} "
                           "micro-batches: forward each micro-batch")
    expect(len({p for _, p in outs}) == k,
           f"the {k} micro-batches went through {len({p for _, p in outs})} backward pass(es): "
           "call backward once per micro-batch (summing the losses first keeps every "
           "micro-batch's activations alive at once, which is what accumulation avoids)")
    rows = sorted(r for r, _ in model.rows)
    expect(rows == sorted(sizes), f"the outputs that took part in backward had {rows} rows, "
                                  f"for micro-batches of {sorted(sizes)}: forward each "
                                  "micro-batch on its own, never a concatenated batch")
    expect(all(nonzero for _, nonzero in model.rows),
           "a micro-batch's loss reached backward with a zero weight: every micro-batch "
           "contributes its share of the mean loss")
    syncs = [s for s, _ in sorted(outs, key=lambda o: o[1])]
    expect(syncs[-1], "the last backward ran inside no_sync(): the gradients are never "
                      "all-reduced")
    expect(not any(syncs[:-1]), f"backward {syncs.index(True) + 1} of {k} synchronised: only the "
                                "last one should (run the others' forward inside model.no_sync())")
    ref = _SyncRecorder(g)
    ref.load_state_dict(model.state_dict())
    X, y = torch.cat([m[0] for m in micro]), torch.cat([m[1] for m in micro])
    loss_fn(ref(X), y).backward()
    grad, want = model.lin.weight.grad, ref.lin.weight.grad
    expect(grad is not None, "no gradient on the model's weights")
    per_k = sum(loss_fn(ref.lin(Xm), ym) / k for Xm, ym in micro)
    mean_of_means = torch.autograd.grad(per_k, ref.lin.weight)[0]
    expect(not torch.allclose(grad, mean_of_means, atol=1e-5),
           f"the gradient is the mean of the {k} micro-batches' mean losses, but they hold "
           f"{sizes} examples: weight each micro-batch's loss by its share of all the examples "
           "(len(y) / total)")
    expect(not torch.allclose(grad, mean_of_means * k, atol=1e-5),
           f"gradients are about {k}x too large: scale each micro-batch's loss by its share of "
           "all the examples")
    expect(torch.allclose(grad, want, atol=1e-5),
           "the accumulated gradient is not that of the mean loss over all the examples")


class _Heads(nn.Module):
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


@check("unused_parameters", observes=[
    "the names returned for losses over random heads (one head used with a zero weight)",
    "every torch operation the answer ran: a graph walk computes nothing, while backward or "
    "torch.autograd.grad computes every gradient (the cost DDP's walk avoids)"])
def check_unused_parameters(fn):
    """fn(model, loss) -> the sorted names of `model`'s parameters that get no gradient from
    `loss`, found by walking the autograd graph from loss.grad_fn, before any backward."""
    g = fresh_generator()
    for trial in range(3):
        model = _Heads(g)
        X = torch.randn(randint(g, 2, 6), 3, generator=g)
        heads = ["a", "b", "c"]
        used = [h for h in heads if torch.rand((), generator=g) < 0.5] or ["a"]
        zero = [h for h in heads if h not in used][:1] if trial > 0 else []
        out = model(X, used + zero)
        loss = sum(out[h].pow(2).mean() for h in used) + sum(0 * out[h].sum() for h in zero)
        want = sorted(name for name, _ in model.named_parameters()
                      if name.split(".")[0] not in used + zero + ["trunk"])
        what = f"unused_parameters with heads {used} in the loss" + (
            f" and head {zero[0]!r} with a zero weight" if zero else "")
        with Recorder() as rec:
            got = fn(model, loss)
        expect(all(p.grad is None for p in model.parameters()),
               f"{what}: the parameters now have .grad: your function ran a backward pass. DDP "
               "decides before backward, by walking loss.grad_fn's next_functions")
        ran = sorted({op.name for op in rec.ops if op.is_work})
        expect(not ran, f"{what}: your function computed gradients ({', '.join(ran[:4])}): that "
                        "is a backward pass (torch.autograd.grad runs one too). Walk the graph "
                        "from loss.grad_fn through next_functions instead: it computes nothing")
        try:
            got = sorted(got)
        except TypeError:
            raise CheckFailed(f"{what}: returned {got!r}, expected a list of names") from None
        zero_names = sorted(n for n, _ in model.named_parameters()
                            if zero and n.startswith(zero[0] + "."))
        expect(not set(zero_names) & set(got),
               f"{what}: you report {zero_names} as unused, but they take part (with a zero "
               "weight): their gradient is zero, not missing")
        expect(got == want, f"{what}: returned {got}, expected {want}")
