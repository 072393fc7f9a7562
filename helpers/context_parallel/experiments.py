"""Part VII, context parallelism: the chapter's runs, `fn(rank, world, cfg) -> result` for
helpers.launch. Every rank builds the same global tensors from cfg["seed"], moves them to its
device and keeps its share of the sequence, so each result can be set beside the unsplit
computation. Results come back on the CPU."""
import torch

from ..activations import saved_tensor_bytes
from ..compare import cpu_copy, max_diff
from ..runtime.comm import DistComm
from ..runtime.launch import take
from ..runtime.mesh import device_mesh
from ..tiny_models import SmallAttention
from .results import RingRun, RotateRun, SavedAt, TorchCPRun, UlyssesRun
from .scratch import CPAttention, RingCensus, attention_reference, ring_attention, shard_sequence
from .torch_api import ROTATE_METHODS, context_parallel_status, torch_context_parallel
from .ulysses import ulysses_attention

__all__ = ["qkv_inputs", "cp_attention_run", "cp_ulysses_run",
           "cp_activation_memory", "cp_torch_run"]


def qkv_inputs(B, H, T, D, seed=0, device="cpu"):
    """q, k, v and an output gradient, each (B, H, T, D), the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g).to(device) for _ in range(4)]


def cp_attention_run(rank: int, world: int, cfg: dict) -> dict[str, RingRun]:
    """Ring attention (causal or not) on this rank's tokens for each layout in cfg["layouts"]:
    its output and q/k/v gradients, the blocks it computed (ring_attention's stats: products
    formed and useful, per step, forward and backward), the bytes it sent forward and backward,
    the sends, and the most K/V blocks' worth of point-to-point buffers alive at once in
    forward and in backward (RingCensus; a K/V block: this rank's keys and values): a
    results.RingRun per layout, by its name. cfg: B, H, T, D, causal, layouts, seed."""
    device, B, H, T, D, causal, layouts, seed = take(cfg, "device", "B", "H", "T", "D",
                                                     causal=True, layouts=("zigzag",), seed=0)
    comm = DistComm(device=device)
    q, k, v, g = qkv_inputs(B, H, T, D, seed, device)
    results = {}
    for layout in layouts:
        ql, kl, vl = (shard_sequence(t, world, rank, layout).requires_grad_() for t in (q, k, v))
        gl = shard_sequence(g, world, rank, layout)
        block = 2 * kl.numel() * kl.element_size()
        stats = []
        comm.reset_counts()
        with RingCensus(block) as fwd_census:
            out = ring_attention(ql, kl, vl, comm, causal, layout, stats)
        fwd = comm.traffic.wire_bytes("send")
        with RingCensus(block) as bwd_census:
            out.backward(gl)
        results[layout] = RingRun(out=cpu_copy(out), dq=cpu_copy(ql.grad), dk=cpu_copy(kl.grad),
                                  dv=cpu_copy(vl.grad), blocks=stats, fwd_bytes=fwd,
                                  bwd_bytes=comm.traffic.wire_bytes("send") - fwd,
                                  sends=comm.traffic.calls("send"),
                                  live_fwd=fwd_census.peak_blocks,
                                  live_bwd=bwd_census.peak_blocks)
    return results


def cp_ulysses_run(rank: int, world: int, cfg: dict) -> UlyssesRun:
    """All-to-all (Ulysses) attention on this rank's tokens (contiguous split): its output and
    q/k/v gradients and the bytes its all-to-alls sent, beside the ring's bytes on the same
    tokens: a results.UlyssesRun. cfg: B, H, T, D, causal, seed."""
    device, B, H, T, D, causal, seed = take(cfg, "device", "B", "H", "T", "D", causal=True,
                                            seed=0)
    comm = DistComm(device=device)
    q, k, v, g = qkv_inputs(B, H, T, D, seed, device)
    ql, kl, vl = (shard_sequence(t, world, rank, "contiguous").requires_grad_()
                  for t in (q, k, v))
    comm.reset_counts()
    out = ulysses_attention(ql, kl, vl, comm, causal)
    out.backward(shard_sequence(g, world, rank, "contiguous"))
    return UlyssesRun(out=cpu_copy(out), dq=cpu_copy(ql.grad), dk=cpu_copy(kl.grad),
                      dv=cpu_copy(vl.grad),
                      sent=comm.traffic.wire_bytes("all_to_all"),
                      calls=comm.traffic.calls("all_to_all"))


def cp_activation_memory(rank: int, world: int, cfg: dict) -> list[SavedAt]:
    """Bytes saved for backward by one causal attention layer (projections and ring attention)
    on this rank's tokens, for each sequence length in cfg["seqs"]; also how far its output and
    gradients are from the unsplit layer's (the weights' gradients summed over the ranks): a
    results.SavedAt per length. cfg: width, heads, batch, seqs, seed."""
    device, width, heads, batch, seqs, seed = take(cfg, "device", "width", "heads", "batch",
                                                   "seqs", seed=0)
    comm = DistComm(device=device)
    torch.manual_seed(seed)
    attn = SmallAttention(width, heads).to(device)
    layer = CPAttention(attn, comm)
    rows = []
    for T in seqs:
        g = torch.Generator().manual_seed(T)
        X = torch.randn(batch, T, width, generator=g).to(device)
        R = torch.randn(batch, T, width, generator=g).to(device)
        attn.zero_grad()
        Xl = shard_sequence(X, world, rank, dim=1).requires_grad_()
        nbytes, out = saved_tensor_bytes(layer, Xl, params=attn.parameters())
        (out * shard_sequence(R, world, rank, dim=1)).sum().backward()
        grads = [p.grad.clone() for p in attn.parameters()]
        for t in grads:
            comm.all_reduce(t)        # the weights' gradient: the sum over every rank's tokens
        ref = attn_ref_grads(attn, X, R)
        local = [shard_sequence(ref[n], world, rank, dim=1) for n in ("out", "x_grad")]
        diff = max_diff(grads + [out, Xl.grad], ref["grads"] + local)
        rows.append(SavedAt(T=T, saved_bytes=nbytes, max_diff=diff))
    return rows


def attn_ref_grads(attn, X, R):
    """The unsplit layer on the whole sequence (plain causal attention): output and gradients."""
    a = attn
    X = X.clone().requires_grad_()
    params = list(a.parameters())
    B, T, _ = X.shape
    q, k, v = (lin(X).view(B, T, -1, a.head_dim).transpose(1, 2) for lin in (a.q, a.k, a.v))
    y = attention_reference(q, k, v, causal=True)
    out = a.proj(y.transpose(1, 2).reshape(B, T, -1))
    grads = torch.autograd.grad((out * R).sum(), params + [X])
    return dict(out=out.detach(), grads=list(grads[:-1]), x_grad=grads[-1])


def cp_torch_run(rank: int, world: int, cfg: dict) -> TorchCPRun:
    """torch's context_parallel on a SmallAttention layer, with each rotate method, against the
    unsplit layer on the same input (the weights' gradients summed over the ranks). Runs only
    on CUDA (context_parallel_status); elsewhere it says why. Returns a results.TorchCPRun
    (torch_version, device, world, runs: {rotate: RotateRun(ran, error, max_diff)})."""
    device, width, heads, batch, T, seed = take(cfg, "device", "width", "heads", "batch", "T",
                                                seed=0)
    about = dict(torch_version=torch.__version__, device=str(device), world=world)
    ok, reason = context_parallel_status(device)
    if not ok:
        return TorchCPRun(**about, runs={m: RotateRun(ran=False, error=reason)
                                         for m in ROTATE_METHODS})
    torch.manual_seed(seed)
    attn = SmallAttention(width, heads).to(device)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(batch, T, width, generator=g).to(device)
    R = torch.randn(batch, T, width, generator=g).to(device)
    mesh = device_mesh((world,), ("cp",), device.type)
    ref = attn_ref_grads(attn, X, R)
    runs = {}
    for rotate in ROTATE_METHODS:
        attn.zero_grad()
        got = torch_context_parallel(attn, X, mesh, R, rotate)
        diff = None
        if got["ran"]:   # the weights' gradients summed over the ranks: the whole sequence's
            grads = [got["grads"][n].to(device) for n, _ in attn.named_parameters()]
            for t in grads:
                torch.distributed.all_reduce(t)
            diff = max_diff(grads, ref["grads"])
        runs[rotate] = RotateRun(ran=got["ran"], error=got["error"], max_diff=diff)
    return TorchCPRun(**about, runs=runs)
