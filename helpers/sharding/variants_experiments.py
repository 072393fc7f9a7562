"""Part V: ZeRO's variants run across processes (their costs are in variants.py):
ZeRO-Offload with FSDP2's `CPUOffloadPolicy`, counting what would cross PCIe (`offload_run`),
and qwZ's quantized all-gather against the plain one (`qwz_vs_all_gather`)."""
import contextlib

import torch

from ..compare import max_diff
from ..runtime.intercept import intercept
from ..runtime.mesh import device_mesh
from .flat import all_gather_flat
from .results import OffloadRun, OffloadSide, QwzRun
from .variants import quantization_bound, quantized_all_gather

__all__ = ["offload_run", "qwz_vs_all_gather"]


@contextlib.contextmanager
def _copies_at_collectives():
    """Bytes handed to all-gathers (under CPU offload, copied host to device first) and bytes
    the reduce-scatters return (copied device to host), counted at dist.* as FSDP2 calls it."""
    seen = dict(h2d=0, d2h=0, gathers=0)

    def copied(name, args, kw):
        gather = name.startswith("all_gather")
        names = ("output_tensor", "input_tensor") if gather else ("output", "input")
        out, inp = (kw[n] if n in kw else args[i] for i, n in enumerate(names))
        t = inp if gather else out
        seen["h2d" if gather else "d2h"] += t.numel() * t.element_size()
        seen["gathers"] += gather
    with intercept(("all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor",
                    "reduce_scatter_single"), copied, who="offload_run"):
        yield seen


def offload_run(rank, world, cfg):
    """FSDP2 per layer with and without `CPUOffloadPolicy`, AdamW from the same start: the
    weights' difference, where each sharded state lives (its device), the bytes of state a
    rank holds, and per step the bytes handed to all-gathers and returned by reduce-scatters
    (what crosses PCIe under offload on a GPU)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    from ..one_process import flat_cross_entropy, local_batch
    from ..runtime.launch import take
    from ..tiny_models import make_batches, make_model
    from .torch_api import full_params
    device, sizes, num_steps, batch_size = \
        take(cfg, "device", sizes=None, num_steps=3, batch_size=8)
    batches = make_batches("mlp", num_steps, batch_size, **(sizes or {}))
    out, full = {}, {}
    for label in ("on device", "offload"):
        offload = label == "offload"
        model = make_model("mlp", **(sizes or {}))
        model = model if offload else model.to(device)
        mesh = device_mesh((world,), ("dp",), device.type)
        policy = dict(offload_policy=CPUOffloadPolicy(pin_memory=device.type == "cuda")) \
            if offload else {}
        for m in list(model.modules())[1:]:
            if any(True for _ in m.parameters(recurse=False)):
                fully_shard(m, mesh=mesh, **policy)
        fully_shard(model, mesh=mesh, **policy)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with _copies_at_collectives() as seen:
            for batch in batches:
                X, y = local_batch(batch, rank, world, device)
                flat_cross_entropy(model(X), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=False)
        local = [p.to_local() for p in model.parameters()]
        state = [v for s in opt.state.values() for v in s.values() if v.dim()]
        state = [v.to_local() if hasattr(v, "to_local") else v for v in state]
        grads = [p.grad.to_local() for p in model.parameters()]
        out[label] = OffloadSide(
            weights=str(local[0].device), grads=str(grads[0].device),
            optimizer=str(state[0].device), device=str(device),
            shard_bytes=sum(t.numel() * t.element_size() for t in local),
            state_bytes=sum(t.numel() * t.element_size() for t in state),
            n_params=sum(p.numel() for p in model.parameters()),
            h2d_per_step=seen["h2d"] / num_steps, d2h_per_step=seen["d2h"] / num_steps,
            gathers_per_step=seen["gathers"] / num_steps)
        full[label] = full_params(model)
    a, b = full["on device"], full["offload"]
    return OffloadRun(on_device=out["on device"], offload=out["offload"],
                      diff=max_diff(a, b))


def qwz_vs_all_gather(rank, world, cfg):
    """A model's flat weights, this rank's shard all-gathered in float32 and in qwZ's int8:
    the largest difference, the bound quantization promises, and the bytes each sent."""
    from ..runtime.launch import take
    from ..runtime.traffic import count_traffic
    from ..tiny_models import make_model
    from .flat import flat_shard
    device, sizes, block = take(cfg, "device", sizes=None, block=256)
    params = list(make_model("mlp", **(sizes or {})).to(device).parameters())
    shard = flat_shard(params, rank, world)
    with count_traffic() as plain_log:
        plain, _ = all_gather_flat(shard, world)
    with count_traffic() as q_log:
        got = quantized_all_gather(shard, world, block)
    bound = max(quantization_bound(plain[r * shard.numel():(r + 1) * shard.numel()], block)
                for r in range(world))
    return QwzRun(diff=max_diff(got, plain), bound=bound, numel=plain.numel(),
                  plain_sent=plain_log.wire_bytes(), qwz_sent=q_log.wire_bytes(), block=block)
