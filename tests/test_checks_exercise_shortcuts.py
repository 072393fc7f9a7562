"""Shortcut answers written for particular exercises, one section per family (tests/check_cases.py's
form; test_checks_any_exercise.py, test_checks_frame_reads.py and
test_checks_course_copies.py hold those that apply to any exercise): a host-side
all-reduce and ranks that meet outside the comm, a convolution split another way, overlap
launched late, accumulation in one go, self-reported values, reading the running program, and
the course's code under another name. Each must fail in the harness, and the right answers
beside them must pass."""
import ast
import copy
import inspect
import textwrap
import types

import torch
import torch.distributed as dist
from check_cases import dp_peers, other, parametrize_cases, shortcut
from torch.nn import functional as F

import helpers

PEEK = "inspects the running program"
OWN = "course's own answer"
RANKS = "read out of its own tensors"


# ---- host-side all-reduce, and ranks that meet outside the comm ---------------------------------
@shortcut("check_allreduce_spread", "stacks every tensor on the host and sums there", "the CPU")
def allreduce_spread_stack_on_host(data):
    total = torch.stack([t.cpu() for t in data]).sum(0)
    for t in data:
        t.copy_(total.to(t.device))


@shortcut("check_allreduce_spread", "accumulates into one host buffer, chunk by chunk",
          "the CPU")
def allreduce_spread_host_buffer(data):
    buffer = torch.zeros(data[0].shape)
    for t in data:
        for piece, part in zip(buffer.tensor_split(len(data)), t.tensor_split(len(data))):
            piece.add_(part.cpu())
    for t in data:
        t.copy_(buffer.to(t.device))


_SHARED = {}


@shortcut("check_dp_average", "each rank's numbers in a module global, summed in Python", RANKS)
def dp_average_python_sum(grads, comm):
    for i, grad in enumerate(grads):
        _SHARED[(dist.get_rank(), i)] = grad.tolist()
    comm.all_reduce(torch.zeros(1))                      # a decoy meeting point
    for i, grad in enumerate(grads):
        rows = [_SHARED[(r, i)] for r in dp_peers(comm)]
        grad.copy_(torch.tensor(rows).mean(0))


class _Board:
    """A class attribute every rank can reach."""
    numbers = {}


@shortcut("check_dp_average", "numbers on a class attribute, summed with sum()", RANKS)
def dp_average_class_attribute(grads, comm):
    for i, grad in enumerate(grads):
        _Board.numbers[(dist.get_rank(), i)] = [x.item() for x in grad.reshape(-1)]
    comm.all_reduce(torch.zeros(1))
    for i, grad in enumerate(grads):
        flat = [sum(_Board.numbers[(r, i)][j] for r in dp_peers(comm)) / comm.world
                for j in range(grad.numel())]
        grad.copy_(torch.tensor(flat).reshape(grad.shape))


def _closure_numpy():
    box = []

    def dp_average(grads, comm):
        box.append((comm.rank, [g.detach().clone().numpy() for g in grads]))
        comm.all_reduce(torch.zeros(1))
        mine = dict(box)
        for i, grad in enumerate(grads):          # each rank's copy turned back into a tensor
            parts = [torch.from_numpy(mine[r][i]) for r in range(comm.world)]
            grad.copy_(torch.stack(parts).mean(0))
    return dp_average


# (numpy arithmetic on the other ranks' copies, and integers between ranks: the answers of
# tests/test_checks_rank_data.py)
shortcut("check_dp_average", "numpy copies in a closure list", RANKS)(_closure_numpy())


@other("check_dp_average", "all_reduce, then each rank reads its own result as Python numbers")
def dp_average_own_numbers_after(grads, comm):
    for grad in grads:
        comm.all_reduce(grad)
        grad.copy_(torch.tensor(grad.tolist()) / comm.world)


@shortcut("check_sharded_server_step", "every device sums everything with exp/prod/log, and "
          "a token pull that reaches nothing", "never pulled")
def sharded_server_every_device(params, grads, devices, lr):
    for i, (p, d) in enumerate(zip(params, devices)):
        mine = [g.to(d) for g in grads]
        total = torch.log(torch.stack([torch.exp(g) for g in mine]).prod(0))
        for j, q in enumerate(params):
            if j != i:
                _ = q[:1].to(d)                                   # a pull, thrown away
        p.sub_(lr * total)


# ---- splitting a convolution another way --------------------------------------------------------
@shortcut("check_conv_split_in_channels", "splits the OUTPUT channels: conv per device, cat",
          "input channels")
def conv_split_out_channels(X, W, b, devices, log=None):
    parts = []
    for d, Wi, bi in zip(devices, W.tensor_split(len(devices)), b.tensor_split(len(devices))):
        if len(Wi):                                   # fewer output channels than devices
            parts.append(F.conv2d(X.to(d), Wi.to(d), bi.to(d)).to(devices[0]))
    return torch.cat(parts, dim=1)


@shortcut("check_conv_split_in_channels", "output channels by unfold + einsum, zero-padded",
          [("elements of work",      # or, on more devices than output channels, a device idle
            "computed nothing that reaches the output")])
def conv_split_out_channels_padded(X, W, b, devices, log=None):
    k, side = len(devices), X.shape[-1] - 2
    total = 0
    for d, rows in zip(devices, torch.arange(W.shape[0]).tensor_split(k)):
        patches = F.unfold(X.to(d), 3)                            # every input channel
        Wi = W[rows].reshape(len(rows), W[0].numel()).to(d)   # none: more devices than rows
        Yi = torch.einsum("ok,nkl->nol", Wi, patches)
        full = torch.zeros(X.shape[0], W.shape[0], Yi.shape[-1], device=d)
        full = full.index_add(1, rows.to(d), Yi)                  # a "partial sum" of zeros
        total = total + full.to(devices[0])
    return total.reshape(X.shape[0], -1, side, side) + b.to(devices[0]).reshape(1, -1, 1, 1)


# ---- overlap launched late ----------------------------------------------------------------------
@shortcut("check_overlap_hooks", "hooks only note the ready gradients; the last one launches all",
          "launched")
def overlap_hooks_last_hook_launches_all(model):
    import torch.distributed as dist
    trainable = [p for p in model.parameters() if p.requires_grad]
    ready, handles = [], []

    def hook(p):
        ready.append(p)
        if len(ready) == len(trainable):
            handles.extend(dist.all_reduce(q.grad, async_op=True) for q in ready)
    for p in trainable:
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for h in handles:
            h.wait()
        handles.clear()
        ready.clear()
        for p in trainable:
            p.grad.div_(dist.get_world_size())
    return finish


@shortcut("check_overlap_hooks", "first hook queues one callback that runs after backward",
          "launched")
def overlap_hooks_queued_callback(model):
    import torch.distributed as dist
    from torch.autograd import Variable
    trainable = [p for p in model.parameters() if p.requires_grad]
    handles, queued = [], []

    def launch_all():
        handles.extend(dist.all_reduce(p.grad, async_op=True) for p in trainable)

    def hook(p):
        if not queued:
            queued.append(True)
            Variable._execution_engine.queue_callback(launch_all)
    for p in trainable:
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for h in handles:
            h.wait()
        handles.clear()
        queued.clear()
        for p in trainable:
            p.grad.div_(dist.get_world_size())
    return finish


# ---- accumulation in one go ---------------------------------------------------------------------
@shortcut("check_accumulate_zero2", "the micro-batch losses summed in one graph, one backward",
          "backward")
def accumulate_zero2_one_graph(model, micro_batches):
    loss = sum(F.cross_entropy(model(X), y) for X, y in micro_batches) / len(micro_batches)
    loss.backward()
    model.finish_gradient_synchronization()
    model.step()
    model.zero_grad()


@shortcut("check_accumulate_gradients", "one graph over every micro-batch, one backward",
          "backward")
def accumulate_gradients_one_graph(model, loss_fn, micro_batches):
    n = sum(len(y) for _, y in micro_batches)
    loss = sum(loss_fn(model(X), y) * len(y) / n for X, y in micro_batches)
    loss.backward()


def _loss(out, y):
    return F.cross_entropy(out, y, reduction="sum")


@shortcut("check_accumulated_step", "net called per micro-batch, one backward of them all",
          "backward")
def accumulated_step_one_graph(net, params, X, y, num_micro, lr):
    total = sum(_loss(net(Xi, params), yi) for Xi, yi in zip(X.tensor_split(num_micro),
                                                             y.tensor_split(num_micro)))
    (total / len(X)).backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad


@shortcut("check_accumulated_step", "net called under no_grad, gradient of the whole batch",
          "backward")
def accumulated_step_gradient_elsewhere(net, params, X, y, num_micro, lr):
    with torch.no_grad():
        for Xi in X.tensor_split(num_micro):
            net(Xi, params)
    (_loss(X @ params[0] + params[1], y) / len(X)).backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad


@other("check_accumulated_step", "autograd.grad per micro-batch, summed by hand")
def accumulated_step_by_hand(net, params, X, y, num_micro, lr):
    total = [torch.zeros_like(p) for p in params]
    for Xi, yi in zip(X.tensor_split(num_micro), y.tensor_split(num_micro)):
        grads = torch.autograd.grad(_loss(net(Xi, params), yi) / len(X), params)
        total = [t + gr for t, gr in zip(total, grads)]
    with torch.no_grad():
        for p, gr in zip(params, total):
            p -= lr * gr


# ---- self-reported values: writing the check's records instead of running ----------------------
@shortcut("check_dp_forward", "the whole batch once, replicas' calls written into net.log",
          "raised")
def dp_forward_forged_log(net, X, devices):
    whole = copy.deepcopy(net).to(devices[0])
    Y = whole.lin(X.to(devices[0]))                   # not forward(): nothing recorded
    pieces = []
    for d, rows in zip(devices, torch.arange(len(X)).chunk(len(devices))):
        replica = copy.deepcopy(net).to(d)
        net.log.keep.append(replica)
        net.log.calls.append((id(replica), len(rows), d, d))
        piece = Y[rows[0]:rows[-1] + 1].clone()
        if net.log.rec is not None:
            net.log.outputs.append((id(replica), net.log.rec.latest(piece)))
        pieces.append(piece)
    return torch.cat(pieces)


@shortcut("check_accumulated_step", "micro-batch calls written into the net's lists", "raised")
def accumulated_step_forged(net, params, X, y, num_micro, lr):
    for Xi in X.tensor_split(num_micro):
        net.sizes.append(len(Xi))
        net.passes.extend(["forward", "backward"])
    (_loss(X @ params[0] + params[1], y) / len(X)).backward()
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad


@shortcut("check_evaluate_accuracy_multi", "shards through the net as a decoy, the accuracy of "
          "X @ W + b on whole batches", "outside the net")
def evaluate_accuracy_multi_decoy(net, params, data_iter, devices):
    right = n = 0
    for X, y in data_iter:
        for Xs, d in zip(X.tensor_split(len(devices)), devices):
            net(Xs.to(d), [p.clone().to(d) for p in params])      # what the net records
        pred = (X @ params[0] + params[1]).argmax(1)                # the count, beside it
        right += int((pred == y).sum())
        n += len(y)
    return right / n


# ---- reading the running program ----------------------------------------------------------------
def _walk(frame, name):
    while frame is not None:
        scope = getattr(frame, "f_" + "locals")
        if name in scope:
            return scope[name]
        frame = getattr(frame, "f_" + "back")
    return None


@shortcut("check_tensor_bytes", "logging's currentframe, reached by a computed name", PEEK)
def tensor_bytes_logging_frame(tensors):
    import importlib
    frame = getattr(importlib.import_module("logging"), "current" + "frame")()
    found = _walk(frame, "want")
    return found if found is not None else sum(t.nbytes for t in tensors)


@shortcut("check_tensor_bytes", "a generator's frame, reached by a computed name", PEEK)
def tensor_bytes_generator_frame(tensors):
    def gen():
        yield
    it = gen()
    next(it)
    found = _walk(getattr(it, "gi_" + "frame"), "want")
    return found if found is not None else sum(t.nbytes for t in tensors)


@other("check_tensor_bytes", "logs what it computes (logging finds its caller's line)")
def tensor_bytes_logs(tensors):
    import io
    import logging
    log = logging.getLogger("my_answer")
    handler = logging.StreamHandler(io.StringIO())
    log.addHandler(handler)
    try:
        total = sum(t.numel() * t.element_size() for t in tensors)
        log.warning("%d bytes", total)
    finally:
        log.removeHandler(handler)
    return total


# ---- twins: another course function that computes the answer (test_checks_hunt.py) ----------
@shortcut("check_tensor_bytes", "twin: held_bytes (the memory chapter's counter)", OWN)
def tensor_bytes_twin(tensors):
    return helpers.held_bytes(tensors)


# ---- the course's code under another name -------------------------------------------------------
def _without_docstring(fn):
    code = fn.__code__
    code = code.replace(co_consts=("my own cuts",) + code.co_consts[1:], co_name="cuts")
    return types.FunctionType(code, fn.__globals__, "cuts", fn.__defaults__, fn.__closure__)


def _locals_renamed(fn):
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    names = {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            node.arg = "my_" + node.arg
        elif isinstance(node, ast.Name) and node.id in names | {"w", "total", "cuts", "lo", "hi"}:
            node.id = "my_" + node.id
    scope = dict(fn.__globals__)
    exec(compile(tree, "<my cell>", "exec"), scope)
    return scope[fn.__name__]


DOCLESS_CUTS = _without_docstring(helpers.balanced_cuts)
RENAMED_CUTS = _locals_renamed(helpers.balanced_cuts)


def _stages(net, cuts, devices):
    """The stages at `cuts`, copied and moved (no course function: only the cuts are the
    course's, so the refusal below is about them)."""
    bounds = [0, *cuts, len(net)]
    return [copy.deepcopy(net[a:b]).to(d) for a, b, d in zip(bounds, bounds[1:], devices)]


@shortcut("check_split_by_params", "balanced_cuts with its docstring replaced",
          [OWN, "balanced_cuts"])
def split_by_params_docless(net, devices):
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in net]
    return _stages(net, DOCLESS_CUTS(sizes, len(devices)), devices)


@shortcut("check_split_by_params", "balanced_cuts with its locals renamed (ast) and exec'd",
          [OWN, "balanced_cuts"])
def split_by_params_locals_renamed(net, devices):
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in net]
    return _stages(net, RENAMED_CUTS(sizes, len(devices)), devices)


test_case = parametrize_cases(__name__)
