"""Checks for the device exercises of Part I: attention split by heads
(within_layer), a parameter server sharded over the devices, gradient accumulation on one device
(data_parallel).

Each runs twice, as the other device exercises: on CPU tensors for the values (and gradients),
and on FakeGPUs (cuda:0..k-1), where the Recorder sees which device ran each operation and what
flowed where. A recording net shows what a one-device answer fed its model.
"""
import math

import torch

from .. import CommLog, loss
from ._core import FakeGPUs, check, describe_device, expect, fresh_generator, randint
from ._core.inputs import expect_unchanged, kept
from .within_layer import _close, _grads_match, _megatron_structure, _spread, _tensor

__all__ = ["check_attention_by_heads", "check_sharded_server_step", "check_accumulated_step"]

CPU = torch.device("cpu")


# ---- within_layer: attention, split by heads -------------------------------------------------
def attention(X, Wq, Wk, Wv, Wo, heads):
    """Unsplit multi-head self-attention of one sequence X (t, d), no biases, no mask."""
    t, e = X.shape[0], Wq.shape[1] // heads
    Q, K, V = ((X @ W).reshape(t, heads, e).transpose(0, 1) for W in (Wq, Wk, Wv))
    A = torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(e), dim=-1) @ V
    return A.transpose(0, 1).reshape(t, heads * e) @ Wo


@check("attention_by_heads", observes=[
    "values and all gradients on CPU tensors, against unsplit multi-head attention (a number of "
    "heads the devices do not divide)",
    "on k simulated GPUs: each device computed its share of the multiply-adds, no product saw "
    "the columns of all heads, no operation mixed devices",
    "the autograd graph: X enters the devices through an autograd.Function (f) and the k "
    "partial outputs leave through one (g)"])
def check_attention_by_heads(fn):
    """fn(X, Wq, Wk, Wv, Wo, heads, devices, log) == attention(X, ...): device i holds whole
    heads (their columns of Wq, Wk, Wv and their rows of Wo), f before, g after."""
    g = fresh_generator()
    for _ in range(3):
        k = randint(g, 2, 3)
        heads = k * randint(g, 2, 3) + randint(g, 1, k - 1)     # never divided evenly
        e, t, d = randint(g, 2, 3), randint(g, 3, 5), 2 * randint(g, 2, 3)
        X = torch.randn(t, d, generator=g).requires_grad_()
        Ws = [(torch.randn(*s, generator=g) / 2).requires_grad_()
              for s in [(d, heads * e)] * 3 + [(heads * e, d)]]
        call = f"attention_by_heads on {k} devices ({heads} heads of width {e})"
        copies = kept(X, *Ws)
        got = _tensor(fn(X, *Ws, heads, [CPU] * k, CommLog()), call, (t, d))
        expect_unchanged(call, copies, [X, *Ws], ["X", "Wq", "Wk", "Wv", "Wo"])
        want = attention(X, *Ws, heads)
        expect(_close(got, want), f"{call}: the output differs from unsplit attention (split by "
               "whole heads: a head's columns of Wq, Wk and Wv, and its rows of Wo, stay together "
               "on one device; tensor_split the heads, not the columns)")
        _grads_match(call, got, want, [X, *Ws], ["X", "Wq", "Wk", "Wv", "Wo"], g)
        gpus = FakeGPUs(k)
        fakes = [gpus.tensor(x, 0) for x in (X, *Ws)]
        Y, rec = gpus.run(fn, *fakes, heads, gpus.devices, CommLog(), what=call)
        width = heads * e
        for op in rec.ancestors(Y):
            if op.flops is not None:
                expect(all(width not in r.shape for r in op.reads),
                       f"{call}: {op.name} on {describe_device(op.device)} used the columns of "
                       f"all {heads} heads at once: device i holds only its heads")
        macs = 3 * t * d * width + 2 * t * t * width + t * width * d
        _spread(call, rec, Y, gpus.devices, macs, "the heads (Wq, Wk, Wv columns, Wo rows)")
        _megatron_structure(call, Y, fakes[0], k)


# ---- data_parallel: a parameter server sharded over the devices -------------------------------
@check("sharded_server_step", observes=[
    "on CPU tensors: afterwards every replica (the same tensor objects, the same storage) holds "
    "the SGD step on the sum of all devices' gradients, uneven chunks included",
    "on k simulated GPUs: every replica pulled parameters (not only gradients) from every "
    "other device, the server of its chunk, and no device added up more than its chunk's "
    "share"])
def check_sharded_server_step(fn):
    """fn(params, grads, devices, lr): params[i], grads[i] flat tensors on devices[i]. Device j
    serves chunk j (tensor_split): it sums chunk j of every gradient, updates chunk j of its
    parameters by SGD (p -= lr * sum) and every device pulls the chunk from it, in place."""
    g = fresh_generator()
    for count in (randint(g, 2, 5), randint(g, 2, 5), 3):
        n = count * randint(g, 2, 6) + randint(g, 1, count - 1)
        start = torch.randn(n, generator=g)
        grads = [torch.randn(n, generator=g) for _ in range(count)]
        lr = randint(g, 1, 9) / 10
        params = [start.clone() for _ in range(count)]
        objects, ptrs = list(params), [p.data_ptr() for p in params]
        what = f"for {count} devices and {n} parameters"
        fn(params, [x.clone() for x in grads], [CPU] * count, lr)
        want = start - lr * torch.stack(grads).sum(0)
        for i, (p, orig) in enumerate(zip(params, objects)):
            expect(p is orig and p.data_ptr() == ptrs[i], f"{what}: replica {i} was not "
                   "updated in place (the list holds a new tensor, or its storage was replaced);"
                   " pull the chunks into the replica's own tensor with copy_()")
        for i, p in enumerate(objects):
            if torch.allclose(p, want, rtol=1e-5, atol=1e-5):
                continue
            hint = ""
            if torch.allclose(p, start, atol=1e-6):
                hint = ": it is unchanged; every device pulls every updated chunk"
            elif torch.allclose(p, start - lr * grads[i], rtol=1e-5, atol=1e-5):
                hint = ": it took a step with its own gradient only"
            expect(False, f"{what}: replica {i} differs from the step on the summed gradient "
                          f"(p - lr * sum of the gradients){hint}")
        _served(what, fn, start, grads, lr)


def _served(what, fn, start, grads, lr):
    """Device j sums chunk j (its additions stay within one chunk's), and every replica pulls the
    updated parameters from every server: transfers read the servers' parameters, not only
    gradients."""
    count, n = len(grads), start.numel()
    gpus = FakeGPUs(count)
    params = [gpus.tensor(start, i) for i in range(count)]
    fgrads = [gpus.tensor(x, i) for i, x in enumerate(grads)]
    keys = [p.untyped_storage()._cdata for p in params]
    _, rec = gpus.run(fn, params, fgrads, gpus.devices, lr, what=what)
    chunk = -(-n // count)
    pulled = set()
    for op in rec.transfers():
        src = op.reads[-1 if op.name == "copy_" else 0].key
        pulled.add((src, (op.writes or op.outputs)[0].device))
    for i, d in enumerate(gpus.devices):
        missing = [j for j in range(count) if j != i and (keys[j], d) not in pulled]
        expect(not missing, f"{what}: replica {i} never pulled parameters from device(s) "
               f"{', '.join(map(str, missing))}: the update is the server's, not every "
               "device's; device j updates chunk j of its parameters, and every replica copies "
               "that chunk from device j")
    adds, bound = rec.adds_by_device(), (count + 1) * chunk + count
    for d in gpus.devices:
        a = adds.get(d, 0)
        expect(a <= bound, f"{what}: {describe_device(d)} added up {a} elements (per device: "
               f"{[adds.get(x, 0) for x in gpus.devices]}), more than serving its chunk needs "
               f"(at most about {bound}): device j sums and updates chunk j only")


# ---- data_parallel: gradient accumulation ----------------------------------------------------
class _RecordingNet:
    """net(X, params), a linear layer, recording the examples of each call."""

    def __init__(self):
        self.sizes = []

    def __call__(self, X, params):
        W, b = params
        self.sizes.append(X.shape[0])
        return X @ W + b


@check("accumulated_step", observes=[
    "the examples the check's net saw in each call (one call per micro-batch, none with the "
    "whole batch)",
    "the parameters afterwards (the same tensors), against one SGD step on the mean loss of "
    "the whole batch; micro-batches of unequal size included"])
def check_accumulated_step(fn):
    """fn(net, params, X, y, num_micro, lr): forward and backward one micro-batch at a time
    (tensor_split), the gradients of the summed losses adding up in .grad, then one SGD step
    with the gradient of the whole batch's mean loss (divide by n once)."""
    g = fresh_generator()
    for _ in range(4):
        num_micro = randint(g, 2, 5)
        n = num_micro * randint(g, 2, 4) + randint(g, 1, num_micro - 1)
        d, c = randint(g, 3, 6), randint(g, 2, 4)
        X, y = torch.randn(n, d, generator=g), torch.randint(0, c, (n,), generator=g)
        start = [torch.randn(d, c, generator=g), torch.randn(c, generator=g)]
        lr = randint(g, 1, 9) / 10
        params = [p.clone().requires_grad_() for p in start]
        objects = list(params)
        net = _RecordingNet()
        call = f"accumulated_step(net, params, X of {n} examples, y, {num_micro}, {lr})"
        copies = kept(X, y, *start)
        fn(net, params, X, y, num_micro, lr)
        expect_unchanged(call, copies, [X, y, *start], ["X", "y", "W", "b"])
        ref = [p.clone().requires_grad_() for p in start]
        grads = torch.autograd.grad(loss(X @ ref[0] + ref[1], y).mean(), ref)
        want = [(p - lr * gr).detach() for p, gr in zip(start, grads)]
        micro = [len(s) for s in torch.arange(n).tensor_split(num_micro)]
        expect(n not in net.sizes, f"{call}: the net saw all {n} examples in one call "
               f"(calls: {net.sizes}); run one micro-batch at a time ({micro})")
        expect(sorted(net.sizes) == sorted(micro), f"{call}: the net saw micro-batches of "
               f"{net.sizes} examples; tensor_split makes {micro}")
        for name, p, w, orig in zip(("W", "b"), params, want, objects):
            expect(p is orig, f"{call}: params[{'W b'.split().index(name)}] was replaced by a "
                              "new tensor; update the parameters in place")
            if torch.allclose(p.detach(), w, rtol=1e-5, atol=1e-6):
                continue
            last = [q.clone().requires_grad_() for q in start]
            Xl, yl = X.tensor_split(num_micro)[-1], y.tensor_split(num_micro)[-1]
            gl = torch.autograd.grad(loss(Xl @ last[0] + last[1], yl).sum() / n, last)
            hint = ""
            if all(torch.allclose(q.detach(), s - lr * x, atol=1e-6)
                   for q, s, x in zip(params, start, gl)):
                hint = ": only the last micro-batch's gradient was used; .grad adds up over " \
                       "backward calls, so do not zero it between micro-batches"
            else:
                hint = (": sum each micro-batch's per-example losses and divide by the whole "
                        f"batch's {n} once (averaging the micro-batches' means weighs "
                        "unequal micro-batches wrongly)")
            expect(False, f"{call}: {name} differs from one SGD step on the whole batch's mean "
                          f"loss{hint}")
