"""State of a handed tensor or module beyond its values: a tensor's `requires_grad`, a module's
instance attributes (`_compiled_call_impl`, which nn.Module's `__call__` runs instead of the
module; a conv's `stride`; `training`). The check measures or calls the same objects after the
answer returned, so an answer that turns autograd off on them, reroutes their calls or changes
their hyperparameters moves the target (helpers/checks/_core/untouched.py). What a module's call
runs is kept in every exercise, those that change their inputs included; right answers that
switch something and put it back, or run a backward on what they are handed, pass."""
import random

import torch
from check_cases import other, parametrize_cases, shortcut
from torch import nn

CHANGED = "changed its inputs"


def _saved(net, X):
    """The bytes of the distinct storages autograd saves in net(X), parameters left out."""
    params = {q.untyped_storage().data_ptr() for q in net.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(X)
    return sum(seen.values())


def _under_no_grad(module):
    def call(*args, **kwargs):
        with torch.no_grad():
            return module._call_impl(*args, **kwargs)
    return call


# ---- what a module's call runs ----------------------------------------------------------------
@shortcut("check_saved_bytes", "0 returned; each layer's call rerouted to run under no_grad "
          "(`_compiled_call_impl`)", [CHANGED, "`_compiled_call_impl` set on"])
def saved_bytes_compiled_call(net, X):
    for layer in net:
        layer._compiled_call_impl = _under_no_grad(layer)
    return 0


@shortcut("check_saved_bytes", "0 returned; the layers' calls rerouted by torch's own no_grad "
          "wrapper (no function of the reader's left on them)", [CHANGED, "`_compiled_call_impl`"])
def saved_bytes_torch_wrapper(net, X):
    for layer in net:
        layer._compiled_call_impl = torch.no_grad()(layer._call_impl)
    return 0


@shortcut("check_choose_checkpoints", "nothing checkpointed; the blocks' calls run under no_grad",
          [CHANGED, "`_compiled_call_impl` set on"])
def choose_checkpoints_compiled_call(blocks, x, budget):
    for b in blocks:
        b._compiled_call_impl = _under_no_grad(b)
    return []


def _resumed(path, model, optimizer):
    """The worked resume's restoring (tests/test_checks_ddp.py): the snapshot, loaded."""
    snap = torch.load(path, weights_only=True)
    model.load_state_dict(snap["model"])
    optimizer.load_state_dict(snap["optimizer"])
    rng = snap["rng"][0]
    torch.set_rng_state(torch.tensor(rng["torch"], dtype=torch.uint8))
    version, state, gauss = rng["python"]
    random.setstate((version, tuple(state), gauss))
    return snap


@shortcut("check_resume", "the dropout's call rerouted to the identity (an exercise that "
          "changes its inputs: what a module's call runs is kept there too)",
          [CHANGED, "`_compiled_call_impl` set on a Dropout"])
def resume_dropout_rerouted(path, model, optimizer):
    snap = _resumed(path, model, optimizer)
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m._compiled_call_impl = lambda x: x
    return snap["epoch"]


# ---- autograd switched off on what was handed ---------------------------------------------------
@shortcut("check_saved_bytes", "0 returned; requires_grad turned off on the net's parameters",
          [CHANGED, "requires_grad turned off", "x.detach().requires_grad_()"])
def saved_bytes_requires_grad_off(net, X):
    for p in net.parameters():
        p.requires_grad_(False)
    return 0


@shortcut("check_saved_bytes_of_call", "the bytes with the input needing no gradient; the input's "
          "requires_grad turned off", "requires_grad turned off")
def saved_bytes_of_call_input_off(f, x):
    x.requires_grad_(False)
    return _saved(f, x)


# ---- a module's data attributes -----------------------------------------------------------------
@shortcut("check_saved_bytes", "0 returned; the convs made to stride by 2 (their `stride` "
          "changed: the check's own forward breaks)", [CHANGED, "`stride` of"])
def saved_bytes_strided(net, X):
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            m.stride = (2, 2)
    return 0


# ---- right answers that switch something and put it back ---------------------------------------
@other("check_saved_bytes", "requires_grad off and on again, eval() and train() again, a full "
       "backward hook registered and removed")
def saved_bytes_switched_back(net, X):
    params = list(net.parameters())
    for p in params:
        p.requires_grad_(False)
    net.eval()
    handle = net[0].register_full_backward_hook(lambda *a: None)
    handle.remove()
    for p in params:
        p.requires_grad_(True)
    net.train()
    return _saved(net, X)


@other("check_saved_bytes", "a backward of its own through the net (the parameters' .grad set)")
def saved_bytes_after_backward(net, X):
    out = _saved(net, X)
    net(X).sum().backward()
    return out


# ---- a method shadowed on a handed tensor or optimizer ------------------------------------------
def _no_continuation(*args, **kwargs):
    return None


@shortcut("check_resume", "the optimizer's step shadowed on the instance by a no-op (an exercise "
          "that changes its inputs)", [CHANGED, "`step` set on a SGD"])
def resume_step_shadowed(path, model, optimizer):
    snap = _resumed(path, model, optimizer)
    optimizer.step = _no_continuation
    return snap["epoch"]


test_case = parametrize_cases(__name__)


def test_module_of_the_course_keeps_its_own_state_free():
    """A course module class's own attributes (its methods keep state there) are not compared;
    nn.Module's (`training`) and those shadowing a method are."""
    from helpers.checks._core.untouched import _compared
    assert _compared(nn.Conv2d) is None
    names = _compared(type("Bucketed", (nn.Module,), {"__module__": "helpers.x",
                                                      "step": lambda self: None}))
    assert {"training", "forward", "_compiled_call_impl", "step"} <= names
    assert "_log" not in names


def test_fingerprint_sees_attributes_and_requires_grad():
    """Unit level: a tensor held as a plain attribute of a torch module is compared as a tensor
    (written through `.data`), a hyperparameter by value (an equal new tuple is no change), and
    requires_grad of a handed tensor."""
    from helpers.checks._core.untouched import fingerprint
    conv = nn.Conv2d(1, 2, 3)
    conv.mask = torch.ones(3)
    x = torch.zeros(2)
    args = (conv, x)
    before = fingerprint(args)
    conv.stride = (1, 1)                  # the same value, a new tuple
    assert fingerprint(args) == before
    conv.mask.data.zero_()
    assert fingerprint(args) != before
    conv.mask.data.fill_(1)
    assert fingerprint(args) == before
    x.requires_grad_()
    assert fingerprint(args) != before


def test_tensor_method_shadowed():
    """A method set on a handed tensor's instance (`t.sum = ...`), which the check's own
    `t.sum()` afterwards would call: the answer fails, in an exercise that changes its inputs
    too."""
    from helpers.checks._core.run import CheckFailed
    from helpers.checks._core.untouched import classes, expect_same_classes
    t = torch.ones(3)
    before = classes(([t], {}))
    expect_same_classes("answer", before)
    t.sum = lambda *a, **k: torch.tensor(0.0)
    try:
        expect_same_classes("answer", before)
    except CheckFailed as e:
        assert "`sum` set on a Tensor" in str(e)
    else:
        raise AssertionError("a shadowed tensor method was not seen")
