"""Checks for the exercises of the DataParallel chapter (Part III).

Sizes and formulas are judged on fresh inputs with the Recorder watching (an answer that splits
a tensor to measure the pieces ran torch operations) and numpy_work watching numpy (one that
does it on numpy arrays); DataParallel by hand runs once on CPU
tensors for the values and once on simulated GPUs (FakeGPUs) for where every replica, piece and
output lived.
"""
import contextlib
import sys

import torch
from torch import nn

from ._core import (
    CheckFailed,
    FakeGPUs,
    Recorder,
    as_number,
    check,
    describe_device,
    expect,
    fresh_generator,
    near,
    randint,
    rounding_note,
    shown,
    tensor_close,
)
from ._core.declare import judged_scan
from ._core.guard import refuse
from ._core.numpy_work import expect_list, numpy_work
from ._core.references import Reference, split_size_copies

__all__ = ["check_dp_shard_sizes", "check_lr_at", "check_dp_forward"]


def _int_list(value, call):
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    try:
        return [int(v) for v in value]
    except (TypeError, ValueError):
        raise CheckFailed(f"{call} returned {value!r}, expected a list of ints") from None



@check("dp_shard_sizes", references=split_size_copies(), observes=[
    "the sizes returned for fresh (batch, k), including batches that leave GPUs without a "
    "piece, against torch.chunk's",
    "every torch operation the answer ran, and every numpy function it ran on arrays (the "
    "sizes must come from arithmetic, not from chunking a tensor or a numpy array and "
    "measuring it)"])
def check_dp_shard_sizes(fn):
    """fn(batch_size, k): the sizes of the pieces DataParallel's scatter (torch.chunk) makes."""
    g = fresh_generator()
    k = randint(g, 3, 8)
    cases = [(randint(g, 1, 70), randint(g, 2, 8)) for _ in range(6)]
    cases += [(k * randint(g, 2, 5) + 1, k), (k + 1, k)]   # e.g. 5 over 4: chunk makes 3 pieces
    cases.append((randint(g, 10**6, 10**9), randint(g, 2, 8)))  # beyond any table built ahead
    for n, k in cases:
        call = f"dp_shard_sizes({n}, {k})"
        with Recorder() as rec, numpy_work(fn) as arrays:
            value = fn(n, k)
        size = -(-n // k)                       # torch.chunk's arithmetic, for any n
        want = [size] * (-(-n // size) - 1) + [n - size * (-(-n // size) - 1)]
        expect_list(value, call, "size = -(-n // k)")
        ops = sorted({op.name for op in rec.ops})
        expect(not ops, f"{call}: your code built and cut a tensor ({', '.join(ops)}) to "
                        "measure the pieces: work the sizes out with arithmetic, as the exercise "
                        "asks (no torch.chunk)")
        expect(not arrays, f"{call}: your code computed on numpy arrays "
                           f"({', '.join(dict.fromkeys(arrays))}): that is the chunking done "
                           "outside torch, unseen; work the sizes out with arithmetic on the "
                           "numbers (size = -(-n // k), as torch.chunk does)")
        got = _int_list(value, call)
        if got == want:
            continue
        split = [n // k + (i < n % k) for i in range(k)]
        hint = ""
        if got == split:   # first: with n < k tensor_split's zeros also pad chunk's pieces
            hint = (": that is tensor_split; scatter uses torch.chunk (pieces of ceil(n/k) rows, "
                    "so maybe fewer than k pieces)")
        elif got[:len(want)] == want and not any(got[len(want):]):
            hint = (f": torch.chunk returns only {len(want)} pieces here, so {k - len(want)} "
                    "GPU(s) get no piece at all (not an empty one)")
        raise CheckFailed(f"{call} returned {got}, expected {want}{hint}")


@check("lr_at", observes=["the rate returned at every step of fresh warm-ups (0 included) and "
                          "batch ratios (one not a whole number in every call), any real number "
                          "type, to 1e-9 relative (a float32 number to float32's rounding)"])
def check_lr_at(fn):
    """fn(step, base_lr, base_batch, batch, warmup_steps): linear scaling plus linear warm-up."""
    g = fresh_generator()
    apart = randint(g, 0, 3)     # forced, in a fresh case: a batch base_batch does not divide
    for case in range(4):
        base_lr = randint(g, 1, 20) / 100
        base_batch = 2 ** randint(g, 5, 8)
        batch = base_batch * randint(g, 2, 8)
        if case == apart:            # batch // base_batch would round the ratio down
            batch += randint(g, 1, base_batch - 1)
        warmup = randint(g, 2, 12) if case == 0 else 0 if case == 1 else randint(g, 0, 12)
        for step in range(warmup + 3):
            call = f"lr_at({step}, {base_lr}, {base_batch}, {batch}, {warmup})"
            got, dtype = as_number(fn(step, base_lr, base_batch, batch, warmup), call,
                                   with_dtype=True)
            peak = base_lr * batch / base_batch          # after the call
            want = peak * min(1.0, (step + 1) / warmup) if warmup else peak
            if near(got, want, dtype, 16, 1e-9, max(1, want)):
                del peak, want          # none of it stays for the next call to read
                continue
            close = lambda x, got=got, dtype=dtype: near(got, x, dtype, 16, 1e-9)
            if warmup and step < warmup and close(peak):
                msg = "during the warm-up the rate must ramp up, not start at the peak"
            elif batch % base_batch and close(base_lr * (batch // base_batch) * want / peak):
                msg = (f"batch // base_batch rounds the ratio down ({batch} / {base_batch} is "
                       f"{batch / base_batch:g}): linear scaling multiplies by batch / base_batch")
            elif close(base_lr * min(1.0, (step + 1) / max(warmup, 1))) or close(base_lr):
                msg = "the rate must grow with the batch (linear scaling)"
            elif warmup and close(peak * step / warmup):
                msg = "off by one: step 0 is the first step and already gets 1/warmup"
            else:
                msg = f"expected {shown(got, want, 6)[1]}{rounding_note(got, want, dtype)}"
            raise CheckFailed(f"{call} returned {shown(got, want, 6)[0]}: {msg}")


class _CallLog:
    """Shared by a module and all its deep copies: (replica id, rows, device) of every forward."""

    def __init__(self):
        self.calls, self.keep = [], []
        self.rec, self.outputs = None, []      # the Recorder watching, each forward's output

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
        self._forward = _logged(log)     # the check's log, in a closure: no attribute leads
                                         # an answer to it (or to the Recorder it holds)

    def forward(self, X):
        return self._forward(self, X)


def _logged(log):
    """_RecordingLinear's forward (its deep copies share it): every call logged in `log`."""
    def forward(module, X):
        log.keep.append(module)        # alive, so no later copy gets its id()
        log.calls.append((id(module), X.shape[0], X.device, module.lin.weight.device))
        Y = module.lin(X)
        if log.rec is not None:         # (storage, version) of this output as it left
            log.outputs.append((id(module), log.rec.latest(Y)))
        return Y
    return forward


def _dp_case(g):
    k = randint(g, 3, 4)   # with 2 devices chunk and tensor_split always agree
    n = randint(g, 2 * k + 1, 6 * k)
    while (len(torch.arange(n).chunk(k)) < k or [len(c) for c in torch.arange(n).chunk(k)]
           == [len(c) for c in torch.arange(n).tensor_split(k)]):
        n += 1   # a batch where the two ways of cutting differ
    return k, n, randint(g, 2, 6), randint(g, 2, 5)


@check("dp_forward", simulated=True, observes=[
    "on CPU: the outputs against the module's on the whole batch, and which copy of the module "
    "ran on how many rows (the check's module logs every call, deep copies included), and again "
    "on the same module after its weights changed in place (as a training step changes them): "
    "the outputs must follow the new weights (replicas kept from the call before would not)",
    "the dataflow into the output returned: every replica's output reaches it, and no work "
    "outside the replicas does",
    "on k simulated GPUs: the device of every replica's weights and of every piece it ran on, "
    "and of the gathered output (no operation may mix devices)"])
def check_dp_forward(fn):
    """fn(net, X, devices) -> the outputs of one DataParallel-style forward: a replica of `net`
    per device, the batch cut with torch.chunk (as scatter does), each piece run by its own
    replica on its device, the outputs gathered on devices[0] in order."""
    g = fresh_generator()
    with _no_cuda_only(fn):
        for case in range(2):
            k, n, n_in, n_out = _dp_case(g)
            log = _CallLog()
            net = _RecordingLinear(g, n_in, n_out, log)
            X = torch.randn(n, n_in, generator=g)
            what = f"dp_forward on a batch of {n} over {k} devices"
            earlier = _cpu_call(fn, net, X, k, log, what, set())
            if case == 0:       # a step changed net's weights: the replicas must follow them
                with torch.no_grad():
                    net.lin.weight.add_(torch.randn(n_out, n_in, generator=g))
                X = torch.randn(n, n_in, generator=g)
                _cpu_call(fn, net, X, k, log, f"{what}, called again after net's weights "
                          "changed", earlier)
        _placement(fn, g)


# torch.nn.parallel's steps of DataParallel: each runs on real CUDA devices alone (torch raises on
# CPU devices, where the check's first phase runs, and DataParallel's wrapper is left half made),
# so it is refused by name, never read as "your code raised"; name under torch.nn.parallel ->
# (the module that defines it, what to write instead)
_GATHER = "move each output to devices[0] and torch.cat them there, in order"
_CUDA_ONLY = {
    "parallel_apply": ("parallel_apply", "run each replica on its piece yourself, in a loop or in "
                       "a thread per replica (threading.Thread, each joined), as parallel_apply "
                       "does"),
    "replicate": ("replicate", "make the replicas yourself: copy.deepcopy(net).to(d) per device"),
    "scatter": ("scatter_gather", "cut X yourself with X.chunk(len(devices)), each piece .to() "
                "its device"),
    "gather": ("scatter_gather", _GATHER),
    "comm.gather": ("comm", _GATHER),
    "comm.scatter": ("comm", "cut X yourself with X.chunk(len(devices)), each piece .to() its "
                     "device"),
    "comm.broadcast": ("comm", "copy what each device needs yourself, with .to(d) (a replica: "
                       "copy.deepcopy(net).to(d))"),
    "comm.reduce_add": ("comm", "move the tensors to one device with .to() and add them there"),
    "data_parallel": ("data_parallel", "write its steps yourself: replicas by copy.deepcopy, "
                      "pieces by X.chunk, each run on its device, outputs torch.cat on "
                      "devices[0]"),
    "DataParallel": ("data_parallel", "write its steps yourself, as data_parallel's: replicas "
                     "by copy.deepcopy, pieces by X.chunk, outputs torch.cat on devices[0]"),
}
_OWNERS = {name: sys.modules[f"torch.nn.parallel.{module}"]
           for name, (module, _) in _CUDA_ONLY.items()}
_ORIGINALS = {name: getattr(owner, name.rsplit(".", 1)[-1]) for name, owner in _OWNERS.items()}
# where each is refused while the answer runs: (owner, attribute, name, what was there); the
# wrapper class by its __init__ (every binding of it, torch.nn's too; isinstance still works)
_DP = _ORIGINALS["DataParallel"]
_PLACES = tuple([(owner, name.rsplit(".", 1)[-1], name, _ORIGINALS[name])
                for name, owner in _OWNERS.items() if name != "DataParallel"] + [
    (torch.nn.parallel, name, name, _ORIGINALS[name]) for name in _CUDA_ONLY
    if "." not in name and name != "DataParallel"] + [
    (_DP, "__init__", "DataParallel", _DP.__dict__["__init__"])])


def _needs_cuda(name):
    return (f"your code calls torch.nn.parallel.{name}, which needs real CUDA devices and a CUDA "
            "runtime: the check runs your function on CPU devices and on simulated GPUs, where "
            f"torch refuses it. Instead, {_CUDA_ONLY[name][1]}")


def _refused(name):
    message = _needs_cuda(name)     # worded now: the stand-in runs as the answer's code

    def refused(*args, **kwargs):
        refuse(message)
    return refused


@contextlib.contextmanager
def _no_cuda_only(fn):
    """torch.nn.parallel's CUDA-only steps (`_CUDA_ONLY`) refused by name: bound before the call
    (by identity: scan), or looked up in torch.nn.parallel or their modules while the answer
    runs (in both phases); DataParallel when made (named in an isinstance test, it passes)."""
    class Named(Reference):
        def __repr__(self):
            return self.name
    try:
        judged_scan(getattr(fn, "fn", fn), [Named(n, f) for n, f in _ORIGINALS.items()
                                            if f is not _DP], "dp_forward")   # (isinstance)
    except CheckFailed as e:
        used = next((n for n in _CUDA_ONLY if f"your code uses {n} (" in str(e)), None)
        if used is not None:
            raise CheckFailed(_needs_cuda(used)) from None
        raise
    for owner, attr, name, _ in _PLACES:
        setattr(owner, attr, _refused(name))
    try:
        yield
    finally:
        for owner, attr, _, original in _PLACES:
            setattr(owner, attr, original)


def _cpu_call(fn, net, X, k, log, what, earlier):
    """One call on CPU devices, judged; the ids of the replicas that ran (`earlier`: those of
    the call before on the same net, named when this call's outputs missed net's new weights)."""
    n = X.shape[0]
    log.calls.clear()
    log.outputs.clear()
    with Recorder() as rec:
        log.rec = rec
        try:
            out = fn(net, X, [torch.device("cpu")] * k)
        finally:
            log.rec = None
    replicas = [rid for rid, _, _, _ in log.calls]
    stale = earlier & set(replicas)     # a cache refreshed from net's weights passes
    with torch.no_grad():
        want = net.lin(X)
    expect(isinstance(out, torch.Tensor) and out.shape == want.shape,
           f"{what} returned {type(out).__name__} "
           f"{tuple(out.shape) if isinstance(out, torch.Tensor) else ''}, expected the "
           f"gathered outputs of shape {tuple(want.shape)}")
    expect(tensor_close(out.detach(), want, atol=1e-5), f"{what}: " + (
        f"{len(stale)} replica(s) of the call before ran again, with the weights net had then: "
        "replicas kept across calls (a cache, a global) miss every update of net; copy net "
        "afresh on every call, as DataParallel replicates on every forward" if stale else
        "the outputs differ from the module's on the whole batch: gather the pieces' outputs "
        "in order (torch.cat)"))
    rows = [r for _, r, _, _ in log.calls]
    want_rows = [len(c) for c in torch.arange(n).chunk(k)]
    expect(rows != [n], f"{what}: the module ran once on all {n} rows; cut the batch into "
                        "one piece per device (torch.chunk) and run each piece")
    split_rows = [len(c) for c in torch.arange(n).tensor_split(k)]
    expect(sorted(rows) != sorted(split_rows), f"{what}: the pieces had {rows} rows, "
           f"tensor_split's sizes; DataParallel's scatter uses torch.chunk: {want_rows}")
    expect(sorted(rows) == sorted(want_rows),
           f"{what}: the pieces had {rows} rows, expected {want_rows} (torch.chunk)")
    expect(id(net) not in replicas, f"{what}: the original module ran "
           f"{replicas.count(id(net))} of the pieces; give every device its own replica "
           "(copy.deepcopy(net).to(device))")
    expect(len(set(replicas)) == k, f"{what}: {len(set(replicas))} module copies ran the "
                                    f"{k} pieces; each device needs its own replica")
    _gathered(rec, out, log, what)
    return set(replicas)


def _gathered(rec, out, log, what):
    """The output must be made of the replicas' outputs: every one flows into it, and no work
    outside the replicas does (a replica rerun on the whole batch, a decoy `+ 0 * pieces`)."""
    ancestry = rec.ancestors(out)
    indices = {op.index for op in ancestry}
    made = {rec.producer.get(ref) for _, ref in log.outputs}
    expect(made <= indices, f"{what}: the output returned is not made of the replicas' outputs "
                            "(the values match, but some replica's output never reaches it): "
                            "gather what each replica computed on its piece")
    inside = set()
    for index in made:
        inside |= {index} | {op.index for op in rec.ancestors_of_op(index)}
    extra = sorted({op.name for op in ancestry if op.is_work and op.index not in inside})
    expect(not extra, f"{what}: the output was computed outside the replicas "
                      f"({', '.join(extra[:4])}): gather the replicas' outputs as they are "
                      "(torch.cat on devices[0]), with no work of its own")


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
