"""A result that exists for its gradient, judged by its gradient: a loss the chapter adds to the
loss it backpropagates (a router's balancing loss, its z-loss) has done its job only if backward
through it reaches the tensors it was computed from, with the right gradient. Its value alone
cannot tell: rebuilt from numbers (`torch.tensor([...])` of its values, `.item()`, `.tolist()`,
numpy, `.detach()`) it is the same value with no gradient, and the router it should train never
moves. So the check hands the answer tensors that require grad, and `expect_gradient` requires
its result to be a tensor whose graph reaches them, backpropagates it, and compares what they
get with what the course's own function gives them (float32's rounding).
"""
import torch

from .inputs import tensor_close
from .raised import describe, type_name
from .run import CheckFailed, expect
from .settle import reader_class

__all__ = ["expect_gradient", "grads_left"]

_WRONG = ("every part of it must stay on the graph as the formula has it: a .detach() on part "
          "of it, or a term added for its gradient alone, changes what backward gives")

def expect_gradient(got, inputs, reference, what, names, hint, wrong=None, weight=None):
    """Fail unless `got`, the answer's result, backpropagates to each tensor of `inputs` (leaves
    requiring grad: what the answer was handed, or what it was computed from; `names`, in the
    reader's words) the gradient `reference(*leaves)` gives fresh leaves of their values (the
    course's function, run here, after the answer). Called once the value is judged right;
    `hint` says how to keep the result differentiable, `wrong` what changes a gradient on the
    graph (a result on the graph read no values out: `hint` would misname it). `weight`: `got`
    is a tensor of its shape (rows the chapter goes on computing with), and what backpropagates
    is `(got * weight).sum()`, the reference's too; without it `got` is one number."""
    lost = f"{what} has no gradient: {hint}"
    expect(issubclass(type(got), torch.Tensor), lost)        # by type: no `__class__` runs
    if reader_class(type(got)):         # read as a plain tensor, still on its graph
        got = torch._C.TensorBase.as_subclass(got, torch.Tensor)
    expect((weight is not None or got.numel() == 1) and got.grad_fn is not None, lost)
    loss = got.reshape(()) if weight is None else (got * weight).sum()
    try:
        grads = torch.autograd.grad(loss, list(inputs), allow_unused=True)
    except RuntimeError as e:       # torch's words: a saved tensor changed in place, say
        words = describe(e).split(" Hint:")[0]
        raise CheckFailed(f"backward through {what} failed ({type_name(type(e))}: {words}): "
                          "an in-place operation (`pow_`, `mul_`) on a tensor autograd saved "
                          "for backward breaks it; compute the loss out of place") from None
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    want = reference(*leaves)
    wants = torch.autograd.grad(want if weight is None else (want * weight).sum(), leaves)
    for grad, want, name in zip(grads, wants, names, strict=True):
        expect(grad is not None, f"{what} has no gradient with respect to {name}: {hint}")
        scale = max(1.0, float(want.abs().max()))
        if not tensor_close(grad, want, rtol=1e-4, atol=1e-6 * scale,
                            what=f"the gradient of {what} with respect to {name}"):
            off = float((grad.to(want.dtype) - want).abs().max())
            raise CheckFailed(f"{what} has the right value but the wrong gradient with respect "
                              f"to {name} (off by up to {off:.3g}, where it is at most "
                              f"{float(want.abs().max()):.3g}): {wrong or _WRONG}")


def grads_left(named, what):
    """{name: a copy of its .grad} for the (name, parameter) pairs `named`, after the answer's
    backward: a parameter left without .grad (the loss had no graph back to the model) fails
    the answer with words, never the check with an AttributeError."""
    named = list(named)
    missing = [n for n, p in named if p.grad is None]
    expect(not missing, f"{what}: the model's parameters ({', '.join(missing[:3])}) got no "
                        "gradient from your loss: it has no graph back to the model (a new leaf "
                        "made with requires_grad, a detached value): compute it from the "
                        "model's outputs without detaching")
    return {n: p.grad.clone() for n, p in named}
