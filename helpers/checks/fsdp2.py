"""Checks for the exercises of Part V's FSDP2 chapter (book/part5/fsdp2.ipynb): the memory of
activations and recomputation.

Activation bytes are the course's one measure (helpers.saved_tensor_bytes): every storage
autograd saves counted once, parameters left out. Recomputation is seen from hooks on the
blocks' layers (which block recomputes when, in backward) and from the aten operations backward
runs (Recorder).
"""
import tempfile
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from .. import saved_tensor_bytes
from ._core import (
    CheckFailed,
    Recorder,
    as_int,
    check,
    expect,
    fresh_generator,
    randint,
    tensor_close,
    tensor_equal,
)
from ._core.inputs import expect_unchanged, kept

__all__ = ["check_saved_bytes_of_call", "check_checkpointed_forward", "check_choose_checkpoints",
           "check_save_matmuls", "check_dcp_resume"]


class _Twice(nn.Module):
    """Saves one activation twice (y * y) and a view of another (a.t() @ a)."""

    def __init__(self, d, h):
        super().__init__()
        self.lin = nn.Linear(d, h)

    def forward(self, x):
        a = torch.tanh(self.lin(x))
        return (a.t() @ a).sum() + (a * a).sum()


class _Slices(_Twice):
    """Saves two offset slices of one activation, never the whole of it: their storage counts
    once, at its own size (not a slice's, nor one per address)."""

    def forward(self, x):
        a = self.lin(x)
        return (a[:, 1:] * a[:, :-1]).sum()


@check("saved_bytes_of_call", references=["saved_per_layer", "saved_tensor_bytes",
                                          "LiveActivations", "LiveActivations.micro_batch"],
       observes=[
    "the number returned (any real type) for fresh modules and inputs, against the bytes of "
    "the distinct storages autograd saves, parameters left out"])
def check_saved_bytes_of_call(fn):
    """fn(f, *inputs) -> bytes of the tensors autograd saves for backward while the module f
    runs on inputs: each storage once (a tensor saved twice, or a view of one already counted,
    adds nothing), f's parameters left out (they are weights, not activations)."""
    g = fresh_generator()
    n, d, h = randint(g, 3, 20), randint(g, 3, 20), randint(g, 3, 20)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(randint(g, 0, 10**6))
        cases = [("tanh(lin(x)) used as a.t() @ a and a * a", _Twice(d, h)),
                 ("Linear", nn.Linear(d, h)),
                 ("Linear, Tanh, Linear", nn.Sequential(nn.Linear(d, h), nn.Tanh(),
                                                         nn.Linear(h, d))),
                 ("ReLU (saves its output)", nn.ReLU()),
                 ("a = lin(x) used as a[:, 1:] * a[:, :-1]", _Slices(d, h))]
    x = torch.randn(n, d, generator=g, requires_grad=True)
    for what, f in cases:
        call = f"saved_bytes_of_call({what}, x of shape {tuple(x.shape)})"
        got = as_int(fn(f, x), call)
        want, _ = saved_tensor_bytes(f, x)  # after the answer: nothing to read while it runs
        calls, weights = [0], [0]
        ps = {p.untyped_storage().data_ptr() for p in f.parameters()}

        def pack(t, calls=calls, weights=weights, ps=ps):
            calls[0] += t.numel() * t.element_size()
            if t.untyped_storage().data_ptr() in ps:
                weights[0] += t.numel() * t.element_size()
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = f(x)
        expect(not (got == out.numel() * out.element_size() and got != want),
               f"{call}: {got} bytes is the size of the output, not what autograd saves")
        with_params, _ = saved_tensor_bytes(lambda x, f=f: f(x), x)   # weights kept
        expect(not (weights[0] and got == with_params != want),
               f"{call}: {got} bytes counts the parameters ({weights[0]} bytes of weights "
               "reach the pack hook): leave out the storages of f's parameters")
        expect(not (got == calls[0] and got != want),
               f"{call}: {got} bytes sums every tensor the pack hook receives: a tensor saved "
               "by two operations, and the weights (views of the parameters), are counted; "
               "count each storage once and leave the parameters out")
        expect(got == want, f"{call}: {got} bytes, expected {want}" + (
            ": count each storage once at its own size (a slice saved alone keeps its whole "
            "storage, t.untyped_storage(), whose data_ptr() and nbytes() are not the slice's)"
            if isinstance(f, _Slices) else ""))


def _ffn_blocks(g, d, depth):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(randint(g, 0, 10**6))
        return nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.Tanh(), nn.Linear(4 * d, d))
                             for _ in range(depth))


def _seq(blocks, x):
    for b in blocks:
        x = b(x)
    return x


def _graph_names(t):
    names, todo, seen = set(), [t.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        todo += [n for n, _ in node.next_functions]
    return names


@check("checkpointed_forward", observes=[
    "the output, and the gradients after backward, against the plain forward",
    "the bytes autograd saves (each storage once, no parameters) against the plain forward's",
    "which block each backward step recomputes, from hooks on each block's first and last "
    "layers: each block's forward again right after its output's gradient arrives, one block "
    "at a time",
    "the autograd graph: no reentrant checkpoint (CheckpointFunctionBackward)"])
def check_checkpointed_forward(fn):
    """fn(blocks, x) -> the output of the blocks applied in turn, each block under its own
    torch.utils.checkpoint.checkpoint(..., use_reentrant=False)."""
    g = fresh_generator()
    d, n, depth = randint(g, 8, 24), randint(g, 4, 12), randint(g, 3, 5)
    blocks = _ffn_blocks(g, d, depth)
    log, phase = [], ["forward"]
    # hooks on each block's first and last layers, not on the block: a block run as
    # checkpoint(b.forward, x) passes by its own hooks, never by its layers'
    for i, b in enumerate(blocks):
        b[0].register_forward_pre_hook(lambda m, a, i=i: log.append((phase[0], "fwd", i)))

        def out_hook(m, a, out, i=i):
            if phase[0] == "forward" and out.requires_grad:
                out.register_hook(lambda grad: log.append(("backward", "grad", i)))
        b[-1].register_forward_hook(out_hook)
    x = torch.randn(n, d, generator=g, requires_grad=True)
    params = list(blocks.parameters())
    copies = kept(x, *params)
    saved, _ = saved_tensor_bytes(lambda x: fn(blocks, x), x, params=params)
    log.clear()
    out = fn(blocks, x)
    expect(torch.is_tensor(out) and out.requires_grad,
           "the output of checkpointed_forward has no gradient: the checkpointed blocks must stay "
           "in the graph (no torch.no_grad or detach)")
    expect(not any("CheckpointFunction" in name for name in _graph_names(out)),
           "the graph holds a reentrant checkpoint (use_reentrant=True): use "
           "checkpoint(..., use_reentrant=False), which composes with hooks and FSDP")
    phase[0] = "backward"
    out.sum().backward()
    expect(all(p.grad is not None for p in blocks.parameters()),
           "after backward some parameters have no gradient: the checkpointed blocks must stay "
           "in the graph (no torch.no_grad or detach)")
    got = {k: p.grad.clone() for k, p in blocks.named_parameters()}
    blocks.zero_grad(set_to_none=True)
    expect_unchanged("checkpointed_forward", copies, [x, *params],
                     ["x", *(k for k, _ in blocks.named_parameters())])
    phase[0] = "reference"      # the plain forward, after the answer: its hooks log nothing
    plain_saved, _ = saved_tensor_bytes(lambda x: _seq(blocks, x), x, params=params)
    plain = _seq(blocks, x)
    plain.sum().backward()
    expect(out.shape == plain.shape and tensor_close(out, plain, atol=1e-5),
           "checkpointed_forward returned a different output than applying the blocks")
    for k, p in blocks.named_parameters():
        expect(tensor_close(got[k], p.grad, atol=1e-5), f"the gradient of {k} differs")
    expect(saved < plain_saved / 2,
           f"autograd saved {saved} bytes, {saved / plain_saved:.0%} of the {plain_saved} "
           "without checkpointing: checkpoint each block, so only its input is kept")
    back = [(kind, i) for ph, kind, i in log if ph == "backward"]
    redo = [i for kind, i in back if kind == "fwd"]
    expect(sorted(redo) != list(range(depth - 1)),
           f"backward recomputed blocks {redo} but not the last one ({depth - 1}): it ran "
           "without a checkpoint (torch's checkpoint_sequential leaves its last segment plain); "
           "the exercise asks for every block under its own checkpoint: "
           "checkpoint(block, x, use_reentrant=False) for each block, the last included")
    expect(sorted(redo) == list(range(depth)),
           f"backward recomputed blocks {redo}: checkpointing recomputes every block's forward "
           "once during backward")
    for i in range(depth):   # block i recomputed after its output's gradient arrived, alone
        start = back.index(("grad", i)) if ("grad", i) in back else 0
        between = [j for kind, j in back[start:] if kind == "fwd"][:1]
        expect(between == [i],
               f"backward recomputed blocks {redo} in the order {[j for _, j in back]}: all at "
               "once (one checkpoint around several blocks), so their activations are all alive "
               "together and backward's peak is not reduced; give each block its own checkpoint")


def _blocks_with_saved(g, spec=None, d=None, n=None):
    """Blocks (Linear, `tanhs` Tanh, Linear) whose saved bytes do not follow their parameter
    counts: each Tanh saves its output but has no parameter. spec: [(hidden, tanhs), ...].
    The bytes each block saves, and frees when checkpointed, follow from its layers: nothing
    runs before the answer (`_measured` agrees, tests/test_checks_part5_fsdp2.py)."""
    d, n = d or randint(g, 4, 10), n or randint(g, 4, 12)
    spec = spec or [(d * randint(g, 1, 4), randint(g, 1, 5)) for _ in range(randint(g, 4, 6))]
    with torch.random.fork_rng(devices=[]):   # leave the notebook's random numbers alone
        torch.manual_seed(randint(g, 0, 10**6))
        blocks = nn.ModuleList(nn.Sequential(nn.Linear(d, h), *[nn.Tanh() for _ in range(r)],
                                             nn.Linear(h, d)) for h, r in spec)
    x = torch.randn(n, d, generator=g, requires_grad=True)
    size = x.element_size()
    saved = [size * n * (d + r * h) for h, r in spec]   # its input, each Tanh's output
    gain = [size * n * r * h for h, r in spec]          # checkpointed, it keeps its input only
    return blocks, x, saved, gain


def _measured(blocks, x):
    """(saved, gain) of each block, measured: what autograd saves in its forward, and how much
    less when it is checkpointed."""
    saved, gain, h = [], [], x
    for b in blocks:   # a checkpointed block still keeps its input
        saved.append(saved_tensor_bytes(b, h)[0])
        gain.append(saved[-1] - saved_tensor_bytes(
            lambda h, b=b: checkpoint(b, h, use_reentrant=False), h, params=b.parameters())[0])
        h = b(h)
    return saved, gain


@check("choose_checkpoints", observes=[
    "the forward of the blocks with the returned ones checkpointed, measured (each storage "
    "once, no parameters) against the budget",
    "how many blocks were chosen, against the fewest that meet the budget"])
def check_choose_checkpoints(fn):
    """fn(blocks, x, budget) -> the indices of the fewest blocks to checkpoint so that autograd
    saves at most `budget` bytes in a forward of the blocks in turn."""
    g = fresh_generator()
    for case in range(5):
        if case < 2:   # the blocks with the most parameters are not the ones that save most
            blocks, x, saved, gain = _blocks_with_saved(
                g, [(32, 1), (16, 5), (16, 5), (32, 1)], d=8, n=64)
            # case 1: one block would do if checkpointing freed all it saves (not its input)
            budget = sum(saved) - (gain[1] + gain[2] if case == 0 else saved[1])
        else:
            blocks, x, saved, gain = _blocks_with_saved(g)
            budget = int(sum(saved) * (0.25 + 0.4 * torch.rand(1, generator=g).item()))
        got = fn(blocks, x, budget)
        saved, gain = _measured(blocks, x)     # the reference after the answer ran
        total, order = sum(saved), ("each costs a recompute: checkpoint first the blocks that "
                                    "free the most (measured, not guessed from parameters)")
        call = f"choose_checkpoints({len(blocks)} blocks, budget {budget} of {total} bytes)"
        try:
            chosen = sorted({as_int(i, call) for i in got})
        except TypeError:
            raise CheckFailed(f"{call} returned {got!r}, expected a list of indices") from None
        expect(all(0 <= i < len(blocks) for i in chosen),
               f"{call} returned an index outside 0..{len(blocks) - 1}")

        def run(x, blocks=blocks, chosen=chosen):
            for i, b in enumerate(blocks):
                x = checkpoint(b, x, use_reentrant=False) if i in chosen else b(x)
            return x
        measured, _ = saved_tensor_bytes(run, x, params=blocks.parameters())
        expect(measured <= budget,
               f"{call}: with blocks {chosen} checkpointed autograd saves {measured} bytes, over "
               "the budget (measure what each block saves, plainly and checkpointed: a "
               "checkpointed block still keeps its input)")
        left, fewest = total, 0
        for s in sorted(gain, reverse=True):
            if left <= budget:
                break
            left, fewest = left - s, fewest + 1
        if left == budget and sorted((gain[i] for i in chosen), reverse=True) == sorted(
                gain, reverse=True)[:fewest + 1]:    # the right order, one more: stopped on `<`
            order = (f"one block fewer already meets the budget: at most {budget} bytes means <="
                     + ("; or, taken in block order: " + order) * (chosen == [*range(fewest + 1)]))
        expect(len(chosen) == fewest, f"{call}: checkpointed {len(chosen)} blocks {chosen}, "
                                      f"{fewest} suffice: {order}")


class _Mix(nn.Module):
    """Attention over the 4 slices of each row (d wide): two batched products (aten bmm)."""

    def forward(self, h):
        a = h.view(h.shape[0], 4, -1)
        return torch.bmm(torch.bmm(a, a.transpose(1, 2)).softmax(-1), a).reshape(h.shape)


@check("save_matmuls", observes=[
    "the aten operations backward runs with a block checkpointed under the returned policy "
    "(create_selective_checkpoint_contexts), against backward without checkpointing: no matrix "
    "product (the block runs mm, addmm and bmm) run again, the pointwise operations recomputed",
    "the gradients against the plain block's"])
def check_save_matmuls(fn):
    """fn(ctx, op, *args, **kwargs) -> a torch.utils.checkpoint.CheckpointPolicy: MUST_SAVE for
    matrix products (aten mm, addmm, bmm), PREFER_RECOMPUTE for everything else."""
    g = fresh_generator()
    d, n = randint(g, 4, 12), randint(g, 3, 9)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(randint(g, 0, 10**6))
        block = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), _Mix(),   # addmm, bmm, mm
                              nn.Linear(4 * d, d, bias=False), nn.Tanh())
    x = torch.randn(n, d, generator=g, requires_grad=True)

    def backward_ops(run):
        block.zero_grad(set_to_none=True)
        out = run(x)
        with Recorder() as rec:
            out.sum().backward()
        return [op.name for op in rec.ops], {k: p.grad.clone() for k, p in
                                             block.named_parameters()}
    ops, got = backward_ops(lambda x: checkpoint(
        block, x, use_reentrant=False,
        context_fn=lambda: create_selective_checkpoint_contexts(fn)))
    plain, want = backward_ops(block)          # the reference after the answer ran
    for k in want:
        expect(tensor_close(got[k], want[k], atol=1e-5), f"the gradient of {k} differs")
    again = {name: ops.count(name) - plain.count(name) for name in ("addmm", "mm", "bmm")}
    expect(not any(v > 0 for v in again.values()),
           f"backward ran matrix products again ({ {k: v for k, v in again.items() if v} }): "
           "return CheckpointPolicy.MUST_SAVE for aten mm, addmm and bmm, so their outputs are "
           "kept and only cheap operations are recomputed (op is an OpOverload such as "
           "aten.mm.default: compare op.overloadpacket with aten.mm, or op with aten.mm.default)")
    expect(ops.count("gelu") > plain.count("gelu") and ops.count("tanh") > plain.count("tanh"),
           "backward recomputed no pointwise operation (gelu, tanh): everything was saved, as "
           "without checkpointing; return PREFER_RECOMPUTE for the operations that are not "
           "matrix products")


def _drawn_state(net, opt, g, steps):
    """AdamW's state as `steps` steps leave it, drawn rather than trained (the moments random,
    the second positive): the run that saves computes nothing before the answer runs."""
    for p in net.parameters():
        opt.state[p] = {"step": torch.tensor(float(steps)),
                        "exp_avg": torch.empty(p.shape).normal_(0, 0.1, generator=g),
                        "exp_avg_sq": torch.empty(p.shape).uniform_(1e-3, 1e-2, generator=g)}


@check("dcp_resume", changes_inputs=True, references=["dcp_load_resharded"], observes=[
    "a fresh model and AdamW (another initialisation) after the answer loaded a checkpoint "
    "written by torch.distributed.checkpoint as {\"model\": ..., \"optim\": ...} from "
    "get_state_dict: every parameter, every optimizer state tensor, the optimizer's lr and "
    "weight_decay (saved unlike the fresh one's), and the next step, "
    "against the run that saved it"])
def check_dcp_resume(fn):
    """fn(model, optimizer, path) -> load into model and optimizer the checkpoint at path,
    saved with dcp.save({"model": model_sd, "optim": optim_sd}) from get_state_dict."""
    g = fresh_generator()
    d, h = randint(g, 3, 8), randint(g, 3, 8)

    def build(seed):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = nn.Sequential(nn.Linear(d, h), nn.Tanh(), nn.Linear(h, 2))
        return net, torch.optim.AdamW(net.parameters(), lr=1e-2)
    net, opt = build(randint(g, 0, 10**6))
    _drawn_state(net, opt, g, randint(g, 1, 3))
    for group in opt.param_groups:     # as a scheduler leaves them: not the fresh optimizer's
        group["lr"], group["weight_decay"] = 1e-2 * 0.5 ** randint(g, 1, 4), 0.05
    with tempfile.TemporaryDirectory(prefix="dcp-check-") as path, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model_sd, optim_sd = get_state_dict(net, opt)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
        fresh, fresh_opt = build(randint(g, 0, 10**6))
        fn(fresh, fresh_opt, path)
    for (n, p), q in zip(net.named_parameters(), fresh.parameters(), strict=True):
        expect(tensor_equal(p, q), f"after loading, {n} is not the saved one")
    saved, got = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    back = [tensor_equal(got[i][k], v) for i, st in saved.items() for k, v in st.items()
            if torch.is_tensor(got.get(i, {}).get(k))]   # none: the optimizer's part never loaded
    load = ("(get_state_dict(model, optimizer) gives both parts, dcp.load fills them, "
            "set_state_dict puts them back)")
    expect(any(back), "after loading, AdamW's moments did not come back: none of the "
           "optimizer's state is the saved one (its step and moments are a fresh optimizer's): "
           f"the optimizer's part was never loaded. Load it too {load}")
    expect(len(got) == len(saved), f"after loading the optimizer holds state for {len(got)} of "
           f"{len(saved)} parameters: AdamW's moments did not all come back {load}")
    for k in ("lr", "weight_decay"):
        expect(fresh_opt.param_groups[0][k] == opt.param_groups[0][k],
               f"after loading, the optimizer's {k} is {fresh_opt.param_groups[0][k]}, the "
               f"saved one {opt.param_groups[0][k]}: its param_groups never came back "
               "(dcp.load fills the state dict in place; set_state_dict puts it into the "
               "optimizer)")
    for i, st in saved.items():
        for k, v in st.items():
            expect(torch.is_tensor(got[i].get(k)) and tensor_equal(got[i][k], v),
                   f"after loading, the optimizer's {k} of parameter {i} is not the saved one")
    x = torch.randn(6, d, generator=fresh_generator())     # one step each, on the same batch
    for model, o in ((net, opt), (fresh, fresh_opt)):
        model(x).pow(2).mean().backward()
        o.step()
    for (n, p), q in zip(net.named_parameters(), fresh.parameters(), strict=True):
        expect(tensor_close(p, q, atol=1e-6), f"the step after loading moved {n} elsewhere")
