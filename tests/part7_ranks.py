"""Rank functions for the Part VII reliability tests (a spawned rank imports its function by
name, so they live in a module): each case runs on gloo processes and hands back what happened,
so a refusal is seen as a message and a dead rank as a failed launch."""
import torch

from helpers import DistComm, ExpertParallelMoE, MoE, qkv_inputs, ring_attention
from helpers.one_process import flat_cross_entropy, local_batch
from helpers.tiny_models import make_batches


def _refusal(fn):
    """The ValueError message fn raised, or None if it ran."""
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def uneven_tokens(rank, world, cfg):
    """Ring attention and capacity-limited expert parallelism with unequal token counts per
    rank (cfg["tokens"][rank]): each must refuse on every rank, naming the counts."""
    comm = DistComm(device=cfg["device"])
    n = cfg["tokens"][rank]
    q, k, v, _ = (t[..., :n, :] for t in qkv_inputs(1, 2, max(cfg["tokens"]), 4))
    ring = _refusal(lambda: ring_attention(q, k, v, comm, causal=True, layout="contiguous"))
    moe = MoE(width=8, hidden=16, n_experts=2 * world, k=2, capacity_factor=1.25)
    ep = ExpertParallelMoE(moe, comm)
    expert = _refusal(lambda: ep(torch.randn(n, 8)))
    return dict(ring=ring, expert=expert)


def all_tokens_to_one_expert(rank, world, cfg):
    """Dropless expert parallelism with every token routed to expert 0 and an input that needs
    no gradient: forward and backward must finish on every rank (the loss: sum(y * R)).
    Returns this rank's output and its experts' gradients (named as in the MoE)."""
    comm = DistComm(device=cfg["device"])
    moe = MoE(width=8, hidden=16, n_experts=2 * world, k=1, capacity_factor=None)
    with torch.no_grad():
        moe.router.bias[0] += 100.0
    ep = ExpertParallelMoE(moe, comm)
    g = torch.Generator().manual_seed(rank)
    x, R = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    y, _ = ep(x)
    (y * R).sum().backward()
    first = rank * ep.local
    return dict(y=y.detach(), grads={f"experts.{first + i}.{n}": p.grad
                                     for i, e in enumerate(ep.experts)
                                     for n, p in e.named_parameters()})


def census_of_kept_blocks(rank, world, cfg):
    """A ring that keeps every block it receives (what an all-gather holds), watched by
    helpers.RingCensus: the census must see world blocks, as it sees the ring's three."""
    from helpers import RingCensus, ring_pass
    comm = DistComm(device=cfg["device"])
    kv = [torch.full((4, 8), float(rank)), torch.full((4, 8), float(rank))]
    kept = [kv]
    with RingCensus(2 * 4 * 8 * 4) as census:
        for i in range(world - 1):
            kv = ring_pass(comm, kv, 10 + 2 * i).wait()
            kept.append(kv)
    return census.peak_blocks


def accumulation_measured(rank, world, cfg):
    """Part V's engines accumulating over cfg["m"] micro-batches, both ways: the bytes Zero2 and
    FSDPFromScratch send per step (count_traffic), and the bytes FSDPFromScratch holds after
    the micro-batches' backward passes, before the reduction (PeakBytes: storages created by
    the passes and still alive: the gradients)."""
    import contextlib

    import helpers
    m, device = cfg["m"], cfg["device"]
    out = dict(zero2=helpers.zero2_accumulation(rank, world, dict(device=device, micro=m,
                                                                   num_steps=1)))
    batches = make_batches("mlp", m, 8)
    for mode in ("every", "no_sync"):
        model = helpers.FSDPFromScratch(helpers.make_model("mlp").to(device))
        with helpers.count_traffic() as log:
            with helpers.PeakBytes().skip(list(model.parameters())) as peak:
                for i, batch in enumerate(batches):
                    X, y = local_batch(batch, rank, world, device)
                    quiet = mode == "no_sync" and i < m - 1
                    with model.no_sync() if quiet else contextlib.nullcontext():
                        (flat_cross_entropy(model(X), y) / m).backward()
                    if i == m - 2:
                        held = peak.now      # before the last backward (no_sync: unreduced)
            model.finish_gradient_synchronization()
        out[f"fsdp_sent_{mode}"] = log.wire_bytes()
        out[f"fsdp_held_{mode}"] = held
    out["n_params"] = sum(p.numel() for p in helpers.make_model("mlp").parameters())
    return out
