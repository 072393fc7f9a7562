"""Part V's FSDP2 checks (helpers/checks/fsdp2.py) on the three kinds of answers
(tests/check_cases.py): the notebooks' worked answers pass, shortcuts of two kinds or more
fail naming the skipped step (known cheats among them), and other right answers pass.
"""

import numpy as np
import torch
from check_cases import other, parametrize_cases, shortcut, worked
from torch.utils.checkpoint import CheckpointPolicy, checkpoint

import helpers


# ---- fsdp2: Exercise 1 --------------------------------------------------------------------------
@worked("check_saved_bytes_of_call")
def saved_bytes_of_call(f, *inputs):
    params = {p.untyped_storage().data_ptr() for p in f.parameters()}
    seen = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params:
            seen[key] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*inputs)
    return sum(t.untyped_storage().nbytes() for t in seen.values())


@other("check_saved_bytes_of_call", "numpy total, list of storages")
def saved_bytes_of_call_numpy(f, *inputs):
    params = [p.untyped_storage().data_ptr() for p in f.parameters()]
    kept = []

    def pack(t):
        kept.append(t)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*inputs)
    sizes = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in kept}
    return np.int64(sum(v for k, v in sizes.items() if k not in params))


@shortcut("check_saved_bytes_of_call", "every pack call summed", "count each storage once")
def saved_every_call(f, *inputs):
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*inputs)
    return total


@shortcut("check_saved_bytes_of_call", "parameters counted", "leave out the storages")
def saved_with_params(f, *inputs):
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*inputs)
    return sum(t.untyped_storage().nbytes() for t in seen.values())


@shortcut("check_saved_bytes_of_call", "the output's size", "size of the output")
def saved_output_bytes(f, *inputs):
    out = f(*inputs)
    return out.numel() * out.element_size()


@shortcut("check_saved_bytes_of_call", "the course's saved_per_layer", "helpers.saved_per_layer")
def saved_reference(f, *inputs):
    return sum(helpers.saved_per_layer(torch.nn.Sequential(f), inputs[0]))


# ---- fsdp2: Exercise 2 --------------------------------------------------------------------------
@worked("check_checkpointed_forward")
def checkpointed_forward(blocks, x):
    for b in blocks:
        x = checkpoint(b, x, use_reentrant=False)
    return x


@other("check_checkpointed_forward", "functools.partial per block")
def checkpointed_forward_partial(blocks, x):
    import functools
    run = functools.partial(checkpoint, use_reentrant=False)
    for i in range(len(blocks)):
        x = run(blocks[i], x)
    return x


@other("check_checkpointed_forward", "each block's forward method checkpointed")
def checkpointed_forward_method(blocks, x):
    for b in blocks:     # b.forward passes by the block's own hooks, not by its layers'
        x = checkpoint(b.forward, x, use_reentrant=False)
    return x


@shortcut("check_checkpointed_forward", "no checkpointing", "checkpoint each block")
def forward_plain(blocks, x):
    for b in blocks:
        x = b(x)
    return x


@shortcut("check_checkpointed_forward", "one checkpoint around every block", "all at once")
def forward_one_checkpoint(blocks, x):
    def run(x):
        for b in blocks:
            x = b(x)
        return x
    return checkpoint(run, x, use_reentrant=False)


@shortcut("check_checkpointed_forward", "reentrant checkpoint", "use_reentrant=False")
def forward_reentrant(blocks, x):
    for b in blocks:
        x = checkpoint(b, x, use_reentrant=True)
    return x


@shortcut("check_checkpointed_forward", "no graph", "has no gradient")
def forward_no_grad(blocks, x):
    with torch.no_grad():
        return forward_plain(blocks, x)


# ---- fsdp2: Exercise 3 --------------------------------------------------------------------------
def _kept(f, h):
    return saved_bytes_of_call_fn(f, h)


def saved_bytes_of_call_fn(f, h, params=()):
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            seen[t.untyped_storage().data_ptr()] = t
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(h)
    return sum(t.untyped_storage().nbytes() for t in seen.values())


@worked("check_choose_checkpoints")
def choose_checkpoints(blocks, x, budget):
    freed, left, h = [], 0, x
    for b in blocks:   # a checkpointed block still keeps its input
        ps = list(b.parameters())
        plain = saved_bytes_of_call_fn(b, h, ps)
        ckpt = saved_bytes_of_call_fn(lambda h, b=b: checkpoint(b, h, use_reentrant=False), h, ps)
        freed.append(plain - ckpt)
        left += plain
        h = b(h)
    chosen = []
    for i in sorted(range(len(blocks)), key=lambda i: -freed[i]):
        if left <= budget:
            break
        chosen.append(i)
        left -= freed[i]
    return chosen


@other("check_choose_checkpoints", "numpy indices")
def choose_checkpoints_numpy(blocks, x, budget):
    return np.array(choose_checkpoints(blocks, x, budget), dtype=np.int64)


@shortcut("check_choose_checkpoints", "every block", "suffice")
def checkpoint_all(blocks, x, budget):
    return list(range(len(blocks)))


@shortcut("check_choose_checkpoints", "by parameter count", "measure")
def checkpoint_by_params(blocks, x, budget):
    chosen = sorted(range(len(blocks)), key=lambda i: -sum(p.numel()
                                                            for p in blocks[i].parameters()))
    return chosen[:max(1, len(blocks) // 2)]


@shortcut("check_choose_checkpoints", "nothing", "over the budget")
def checkpoint_none(blocks, x, budget):
    return []


@shortcut("check_choose_checkpoints", "the right order, stopped on left < budget", "means <=")
def checkpoint_strictly_under(blocks, x, budget):
    return choose_checkpoints(blocks, x, budget - 1)     # `<= budget - 1`: `< budget` in bytes


def test_choose_checkpoints_budget_from_the_layers_is_the_measured_one():
    """The check sets its budget from the blocks' layers before the answer runs (nothing
    computed) and judges with the bytes measured after: the two agree, so the cases that
    refuse choosing by parameter count keep their budgets."""
    from helpers.checks.fsdp2 import _blocks_with_saved, _measured
    g = torch.Generator().manual_seed(5)
    for spec in ([(32, 1), (16, 5), (16, 5), (32, 1)], None, None, None):
        blocks, x, saved, gain = _blocks_with_saved(g, spec, d=8 if spec else None,
                                                    n=64 if spec else None)
        assert (saved, gain) == _measured(blocks, x)


# ---- fsdp2: Exercise 4 (selective checkpointing) ------------------------------------------------
@worked("check_save_matmuls")
def save_matmuls(ctx, op, *args, **kwargs):
    aten = torch.ops.aten
    if op in (aten.mm.default, aten.addmm.default, aten.bmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


@other("check_save_matmuls", "by overload packet")
def save_matmuls_packet(ctx, op, *args, **kwargs):
    aten = torch.ops.aten
    matmul = op.overloadpacket in (aten.mm, aten.addmm, aten.bmm, aten.baddbmm)
    return CheckpointPolicy.MUST_SAVE if matmul else CheckpointPolicy.PREFER_RECOMPUTE


@shortcut("check_save_matmuls", "save everything", "recomputed no pointwise")
def save_everything(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE


@shortcut("check_save_matmuls", "recompute everything", "ran matrix products again")
def save_nothing(ctx, op, *args, **kwargs):
    return CheckpointPolicy.PREFER_RECOMPUTE


# ---- fsdp2: Exercise 6 (resume from a DCP checkpoint) -----------------------------------------
@worked("check_dcp_resume")
def dcp_resume(model, optimizer, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])


@shortcut("check_dcp_resume", "dcp.load in place, no set_state_dict (param_groups never set)",
          "param_groups never came back")
def dcp_resume_no_set(model, optimizer, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.load({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)


@other("check_dcp_resume", "a Stateful app state")
def dcp_resume_stateful(model, optimizer, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.stateful import Stateful

    class App(Stateful):
        def state_dict(self):
            m, o = get_state_dict(model, optimizer)
            return {"model": m, "optim": o}

        def load_state_dict(self, sd):
            set_state_dict(model, optimizer, model_state_dict=sd["model"],
                           optim_state_dict=sd["optim"])
    app = App()
    state = app.state_dict()
    dcp.load(state, checkpoint_id=path)
    app.load_state_dict(state)


@shortcut("check_dcp_resume", "the model only", "moments did not come back")
def dcp_resume_model_only(model, optimizer, path):
    import torch.distributed.checkpoint as dcp
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state["model"])


@shortcut("check_dcp_resume", "get_state_dict, then the model's part alone loaded and set",
          "the optimizer's part was never loaded")
def dcp_resume_model_part_only(model, optimizer, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict
    model_sd, _ = get_state_dict(model, optimizer)
    state = {"model": model_sd}
    dcp.load(state, checkpoint_id=path)
    set_model_state_dict(model, state["model"])


@shortcut("check_dcp_resume", "torch.load of the folder", "your code raised")
def dcp_resume_torch_load(model, optimizer, path):
    sd = torch.load(path)
    model.load_state_dict(sd["model"])


test_case = parametrize_cases(__name__)
