"""Checks for the exercises of the custom-modules chapter (Part III): a checkpoint's prefix,
gradient accumulation and the graph walk, judged by what autograd actually ran.
"""
import contextlib

import torch
from torch import nn
from torch.nn.modules import utils as module_utils

from ._core import (
    CheckFailed,
    Recorder,
    check,
    expect,
    fresh_generator,
    randint,
    tensor_close,
    tensor_equal,
)
from ._core.declare import judged_scan
from ._core.recorded import Taps
from ._core.references import Reference, blocked

__all__ = ["check_strip_module_prefix", "check_accumulate_gradients", "check_unused_parameters"]


def _forbid(fn, exercise, objects):
    """Refuse an answer whose code reaches one of `objects` ({dotted name: object}), by
    identity (a name bound earlier counts too): the exercise asks to write it."""
    class Named(Reference):
        def __repr__(self):
            return self.name
    try:
        judged_scan(getattr(fn, "fn", fn), [Named(n, o) for n, o in objects.items()], exercise)
    except CheckFailed as e:
        name = next((n for n in objects if n in str(e)), None)
        if name is None:
            raise
        raise CheckFailed(f"the exercise asks you to write {exercise} yourself; your code uses "
                          f"{name}, which does it for you") from None


@check("strip_module_prefix", observes=[
    "the dict returned for keys with and without a leading 'module.', names that merely contain "
    "'module', and the argument left unchanged",
    "by identity: neither helpers.load_checkpoint nor torch's "
    "consume_prefix_in_state_dict_if_present or torch.distributed.utils._replace_by_prefix "
    "(which do it for you)"],
       references=["load_checkpoint", "torch.distributed.utils._replace_by_prefix"])
def check_strip_module_prefix(fn):
    """fn(state_dict) -> a new dict whose keys lose ONE leading "module." (others untouched)."""
    _forbid(fn, "strip_module_prefix", {
        "torch.nn.modules.utils.consume_prefix_in_state_dict_if_present":
            module_utils.consume_prefix_in_state_dict_if_present})
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
        saved, module_utils.consume_prefix_in_state_dict_if_present = (
            module_utils.consume_prefix_in_state_dict_if_present, _refuse_consume)
        try:
            with blocked([_Named("consume_prefix_in_state_dict_if_present", saved)],
                         "strip_module_prefix"):     # a binding made before the check too
                got = fn(sd)
        finally:
            module_utils.consume_prefix_in_state_dict_if_present = saved
        expect(isinstance(got, dict), f"strip_module_prefix returned {type(got).__name__}, "
                                      "expected a dict")
        expect(sd == before and list(sd) == list(before),
               "strip_module_prefix changed its argument: return a new dict")
        want = {k[len("module."):] if k.startswith("module.") else k: v for k, v in sd.items()}
        for k in want:
            expect(k in got, f'key "{k}" is missing from the result (keys: {sorted(got)[:4]}...):'
                             ' strip only a LEADING "module.", once')
            expect(got[k] is want[k] or tensor_equal(got[k], want[k], what=f'"{k}"'),
                   f'the tensor under "{k}" changed')
        expect(len(got) == len(want), f"the result has {len(got)} keys, expected {len(want)}")


class _Named(Reference):
    whose = "torch's copy of what the exercise asks for"

    def __repr__(self):
        return f"torch's {self.name}"


def _refuse_consume(*args, **kwargs):
    raise CheckFailed("the exercise asks you to write strip_module_prefix yourself; your code "
                      "called torch's consume_prefix_in_state_dict_if_present, which does it "
                      "for you")


class _SyncRecorder(nn.Module):
    """A linear model with DDP's no_sync() interface: records, for each micro-batch's output,
    whether the backward pass its gradient flowed in (a callback queued on the autograd engine
    ends each one) synchronised, by DDP's rule (a forward outside no_sync arms the all-reduce,
    the next backward, whoever's, fires it), and how many passes had ended at its forward, in
    `outputs` and `rows`, which the check hands in and keeps (the model holds them only in its
    forward's closure); with `taps` (recorded.Taps), the gradients reaching its outputs."""

    def __init__(self, g, taps=None, outputs=None, rows=None):
        super().__init__()
        with torch.random.fork_rng(devices=[]):   # leave the notebook's random numbers alone
            self.lin = nn.Linear(5, 1)
        with torch.no_grad():
            self.lin.weight.copy_(torch.randn(1, 5, generator=g))
        self.sync = True
        self._forward = _sync_forward(taps, [] if outputs is None else outputs,
                                      [] if rows is None else rows)

    @contextlib.contextmanager
    def no_sync(self):
        old, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = old

    def forward(self, X):
        return self._forward(self, X)


def _sync_forward(taps, outputs, rows):
    """_SyncRecorder's forward: `outputs` gets (its backward pass synchronised, that pass,
    passes ended at its forward) and `rows` (rows, gradient non-zero) for every output that
    takes part in a backward. As DDP's reducer: armed by a forward outside no_sync, disarmed by
    the end of the backward pass that found it armed."""
    state = {"passes": 0, "queued": False, "armed": False, "firing": False}

    def end_of_backward():
        state["passes"] += 1
        state["queued"] = False
        if state["firing"]:
            state["armed"] = state["firing"] = False

    def forward(model, X):
        out, at = model.lin(X), state["passes"]
        if model.sync and torch.is_grad_enabled():
            state["armed"] = True
        if out.requires_grad:
            def seen(grad):
                if not state["queued"]:
                    state["queued"], state["firing"] = True, state["armed"]
                    torch.autograd.Variable._execution_engine.queue_callback(end_of_backward)
                outputs.append((state["firing"], state["passes"], at))
                rows.append((grad.shape[0], bool(grad.detach().abs().sum() > 0)))
                return grad
            out.register_hook(seen)
            if taps is not None:
                taps.tap(out)
        return out
    return forward


@check("accumulate_gradients", observes=[
    "a stand-in model with DDP's no_sync() and DDP's rule (a forward outside no_sync arms the "
    "all-reduce of the next backward, whichever micro-batch's): for every micro-batch's output, "
    "in which backward pass (counted on the autograd engine) its gradient flowed, whether that "
    "pass synchronised, and whether another backward ran between its forward and its own",
    "the gradients left, for micro-batches of unequal sizes, against the gradient of the mean "
    "loss over all their examples, and their dataflow: made by the backwards through the "
    "model's outputs (not computed beside it)",
    "two calls: the model comes in with no .grad, then with a random .grad (a caller's, from "
    "an earlier half of the accumulation), which must still be there, the new gradient added"])
def check_accumulate_gradients(fn):
    """fn(model, loss_fn, micro_batches): the gradient of the mean loss over all the examples of
    the micro-batches (of unequal sizes), one backward per micro-batch, synchronising (outside
    no_sync) only on the last, added to whatever .grad held (the text: do not zero them)."""
    g = fresh_generator()
    for held in (False, True):      # the second call: the model already holds a gradient
        _accumulate_once(fn, g, held)


def _accumulate_once(fn, g, held):
    """One call of accumulate_gradients on fresh micro-batches; `held`: the stand-in comes in
    with a random .grad, which the accumulated gradient must be added to."""
    k = randint(g, 3, 5)        # three or more: no_sync forwards batched before backwards show
    sizes = [randint(g, 2, 7) for _ in range(k)]
    if len(set(sizes)) == 1:
        sizes[-1] += 2                                  # the last micro-batch shorter or longer
    micro = [(torch.randn(s, 5, generator=g), torch.randn(s, 1, generator=g)) for s in sizes]
    rec, outs, seen_rows = Recorder(), [], []
    taps = Taps(rec)
    model, loss_fn = _SyncRecorder(g, taps, outs, seen_rows), nn.MSELoss()
    before = torch.randn(1, 5, generator=g) if held else torch.zeros(1, 5)
    if held:
        model.lin.weight.grad, model.lin.bias.grad = before.clone(), torch.randn(1, generator=g)
    with rec:
        fn(model, loss_fn, micro)
    made = taps.made([p.grad for p in model.lin.parameters()])
    expect(len(outs) == k, f"{len(outs)} micro-batch outputs took part in backward, for {k} "
                           "micro-batches: forward each micro-batch")
    expect(len({p for _, p, _ in outs}) == k,
           f"the {k} micro-batches went through {len({p for _, p, _ in outs})} backward pass(es): "
           "call backward once per micro-batch (summing the losses first keeps every "
           "micro-batch's activations alive at once, which is what accumulation avoids)")
    rows = sorted(r for r, _ in seen_rows)
    expect(rows == sorted(sizes), f"the outputs that took part in backward had {rows} rows, "
                                  f"for micro-batches of {sorted(sizes)}: forward each "
                                  "micro-batch on its own, never a concatenated batch")
    expect(all(nonzero for _, nonzero in seen_rows),
           "a micro-batch's loss reached backward with a zero weight: every micro-batch "
           "contributes its share of the mean loss")
    late = sorted(p for _, p, at in outs if at != p)
    expect(not late, f"backward {late[0] + 1 if late else 0} of {k} ran after another "
                     "micro-batch's forward: run each micro-batch's forward and its backward "
                     "together, one micro-batch after the other (forwarding them all first "
                     "keeps every micro-batch's activations alive at once, which accumulation "
                     "avoids; and DDP's forward outside no_sync arms the all-reduce for the very "
                     "next backward, whichever micro-batch's it is)")
    syncs = [s for s, _, _ in sorted(outs, key=lambda o: o[1])]
    expect(syncs[-1], "the last backward ran inside no_sync(): the gradients are never "
                      "all-reduced")
    expect(not any(syncs[:-1]), f"backward {syncs.index(True) + 1} of {k} synchronised: only the "
                                "last one should (run the others' forward inside model.no_sync())")
    ref = _SyncRecorder(g)
    ref.load_state_dict(model.state_dict())
    X, y = torch.cat([m[0] for m in micro]), torch.cat([m[1] for m in micro])
    loss_fn(ref(X), y).backward()
    expect(model.lin.weight.grad is not None, "no gradient on the model's weights")
    grad, want = model.lin.weight.grad - before, ref.lin.weight.grad   # what was added
    expect(not held or not tensor_close(model.lin.weight.grad, want, atol=1e-5),
           "the model came in with a gradient in .grad (the caller's: an earlier half of the "
           "accumulation, an auxiliary loss) and it is gone: do not zero the gradients; "
           "backward adds to what .grad holds")
    expect(made, "the gradients left in .grad were not made by the backwards through the "
                 "model's outputs (a gradient computed beside the model, its backwards only "
                 "decoys): let each micro-batch's backward accumulate into .grad")
    per_k = sum(loss_fn(ref.lin(Xm), ym) / k for Xm, ym in micro)
    mean_of_means = torch.autograd.grad(per_k, ref.lin.weight)[0]
    expect(not tensor_close(grad, mean_of_means, atol=1e-5),
           f"the gradient is the mean of the {k} micro-batches' mean losses, but they hold "
           f"{sizes} examples: weight each micro-batch's loss by its share of all the examples "
           "(len(y) / total)")
    expect(not tensor_close(grad, mean_of_means * k, atol=1e-5),
           f"gradients are about {k}x too large: scale each micro-batch's loss by its share of "
           "all the examples")
    expect(tensor_close(grad, want, atol=1e-5),
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
    "the names returned, as returned (a list or tuple, in sorted order), for losses over random "
    "heads (one head used with a zero weight; the first draw leaves a head out)",
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
        used = [h for h in heads if float(torch.rand((), generator=g)) < 0.5] or ["a"]
        used = used[:2] if trial == 0 else used     # forced: a head unused, two names in order
        zero = [h for h in heads if h not in used][:1] if trial > 0 else []
        out = model(X, used + zero)
        loss = sum(out[h].pow(2).mean() for h in used) + sum(0 * out[h].sum() for h in zero)
        what = f"unused_parameters with heads {used} in the loss" + (
            f" and head {zero[0]!r} with a zero weight" if zero else "")
        with Recorder() as rec:
            got = fn(model, loss)
        want = sorted(name for name, _ in model.named_parameters()      # after the call
                      if name.split(".")[0] not in used + zero + ["trunk"])
        expect(all(p.grad is None for p in model.parameters()),
               f"{what}: the parameters now have .grad: your function ran a backward pass. DDP "
               "decides before backward, by walking the graph (from the forward's outputs); walk "
               "yours from loss.grad_fn through next_functions")
        ran = sorted({op.name for op in rec.ops if op.is_work})
        expect(not ran, f"{what}: your function computed gradients ({', '.join(ran[:4])}): that "
                        "is a backward pass (torch.autograd.grad runs one too). Walk the graph "
                        "from loss.grad_fn through next_functions instead: it computes nothing")
        expect(isinstance(got, list | tuple) and all(isinstance(n, str) for n in got),
               f"{what}: returned a {type(got).__name__}, expected a list of the names, sorted "
               "(a set or a dict has no order to promise)")
        expect(list(got) == sorted(got), f"{what}: returned {list(got)}, not in sorted order: "
                                         "return the names sorted (sorted(...))")
        got = list(got)
        zero_names = sorted(n for n, _ in model.named_parameters()
                            if zero and n.startswith(zero[0] + "."))
        expect(not set(zero_names) & set(got),
               f"{what}: you report {zero_names} as unused, but they take part (with a zero "
               "weight): their gradient is zero, not missing")
        expect(got == want, f"{what}: returned {got}, expected {want}")
