"""A recording model (a net the check hands the answer and whose calls it counts) and the work
done beside it.

A check that counts the calls of its own net, and the backwards through what they returned,
sees only that those calls happened: an answer can make them as decoys (on the right
micro-batches, even weighted 0) and compute the result with the parameters beside the net
(`X @ W + b`, `F.linear`, `torch.autograd.grad` of a copy). Two guards, both under a Recorder
that was active while the answer ran:

- `outside_calls(rec, spans, params, exits)`: work (or a read out of torch, exits.py) on the
  parameters, or on copies of them, that did not run inside the net's recorded calls
  (`spans`: the ranges of the Recorder's operations each call ran). For answers that only
  evaluate: every prediction comes from the net.
- `Taps`: the gradient backward delivers to each output of a recorded call, tapped by a tensor
  hook (`taps.tap(out)`, in the net's call); `taps.made(tensors)` is True when each of
  `tensors` (the parameters after a step, or their `.grad`) is computed from one of them. For
  answers that train: the step or the gradients left must come from the recorded backwards;
  a gradient computed beside the net never reads them.

What they do not see: a result that reads the tapped gradients only through arithmetic that
cancels them (`g_beside + 0 * W.grad`).
"""
import threading

from .observe import storage_key
from .run import observer_failed

__all__ = ["outside_calls", "Taps"]


def outside_calls(rec, spans, params, exits):
    """The first operation (or exit) that computed with `params`, or copies of them, outside the
    recorded calls `spans` (ranges of `rec.ops` indices); None if there was none."""
    inside = {i for span in spans for i in span}
    keys = {storage_key(p) for p in params}
    for op in rec.ops:
        if op.index in inside or not any(r.key in keys for r in op.reads):
            continue
        if op.is_work or op.name == "_local_scalar_dense":
            return op.name
        keys |= {r.key for r in op.outputs + op.writes}      # copies and moves of them
    return next((how for key, how in exits if key in keys), None)


class Taps:
    """The gradients that backward delivered to a recording net's outputs (see above). Its state
    lives in closures, and the hook it registers is one: a hook found on an output leads to no
    list an answer could add a gradient to. Hand a net only a call that taps its own outputs,
    never `tap` itself (an answer would tap a tensor computed beside the net)."""

    __slots__ = ("tap", "made")

    def __init__(self, rec):
        refs, lock = [], threading.Lock()

        def seen(grad):
            try:
                with lock:
                    refs.append(rec.latest(grad))
            except Exception as e:       # the tap's own failure: never the answer's
                raise observer_failed("the check's tap on a gradient of its net", e) from e

        def tap(out):
            """In the net's call: watch the gradient that reaches `out` in any backward."""
            if out.requires_grad:
                out.register_hook(seen)

        def made(tensors):
            """True when every tensor of `tensors` is computed from a tapped gradient."""
            with lock:
                tapped = set(refs)
            return bool(tapped) and all(
                t is not None and rec.flowed([rec.latest(t)]) & tapped for t in tensors)
        self.tap, self.made = tap, made
