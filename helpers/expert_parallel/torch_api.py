"""Part VII: expert parallelism as production code runs it (torchtitan's MoE), with PyTorch's
pieces: the tokens permuted so that each expert's rows are contiguous, the dispatch and the
combine as all_to_all_single_autograd (torch.distributed._functional_collectives: the
all-to-all with its backward), the local experts' weights stacked as DTensors sharded over
the expert-parallel mesh dimension, and run as one grouped GEMM (torch._grouped_mm; where this
torch or the sizes do not allow it, a loop over the experts, and it says so). Dropless; a
shared expert and the router z-loss come with helpers.MoE.

EP x DP: world = dp x ep ranks on a (dp, ep) mesh, ep consecutive. The experts are split over
the "ep" dimension; an expert's replicas live on the dp ranks of its "dp" column, so its
gradient is reduced over that group only (world / ep ranks); the router's and the shared
expert's over all ranks.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..runtime.mesh import device_mesh
from .moe import load_balancing_loss, router_z_loss

__all__ = ["grouped_mm", "grouped_mm_status", "permute_by_expert", "GroupedExperts", "EPMoE",
           "ep_dp_mesh"]

_STATUS = {}


def grouped_mm_status(device="cpu"):
    """(usable, reason): whether torch._grouped_mm runs forward and backward on `device` in
    this torch (tried once on a small case; float32, widths a multiple of 4)."""
    device = torch.device(device)
    if device.type not in _STATUS:
        if not hasattr(torch, "_grouped_mm"):
            _STATUS[device.type] = (False, f"torch {torch.__version__} has no torch._grouped_mm")
        else:
            try:
                x = torch.randn(6, 8, device=device, requires_grad=True)
                w = torch.randn(2, 8, 8, device=device, requires_grad=True)
                offs = torch.tensor([2, 6], dtype=torch.int32, device=device)
                torch._grouped_mm(x, w, offs=offs).backward(torch.ones(6, 8, device=device))
                _STATUS[device.type] = (True, f"torch._grouped_mm on {device.type}")
            except (RuntimeError, NotImplementedError) as e:
                _STATUS[device.type] = (False, f"torch._grouped_mm does not run on "
                                               f"{device.type} here ({str(e)[:80]})")
    return _STATUS[device.type]


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward hands a contiguous gradient on (the grouped GEMM's backward
    refuses expanded ones)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def grouped_mm(x, w, counts):
    """Rows counts[0] of x times w[0], the next counts[1] rows times w[1], ...: one grouped GEMM
    (x (N, a), w (G, a, b) -> (N, b)), with torch._grouped_mm where it runs for these sizes,
    else a loop over the groups (the same products)."""
    ok, _ = grouped_mm_status(x.device)
    aligned = x.dtype in (torch.float32, torch.bfloat16) and x.shape[1] % 8 == 0 and \
        w.shape[2] % 8 == 0
    if ok and aligned and len(x):
        offs = torch.cumsum(torch.as_tensor(counts, device=x.device), 0).to(torch.int32)
        return _ContiguousGrad.apply(torch._grouped_mm(x.contiguous(), w, offs=offs))
    return torch.cat([xi @ wi for xi, wi in zip(x.split(list(counts)), w, strict=True)])


def permute_by_expert(expert, n_experts):
    """Token permutation: (order, counts) with order the choices (rows of expert.reshape(-1),
    token-major) sorted by expert, stably, and counts[e] the choices of expert e; choice i is
    of token i // k."""
    flat = expert.reshape(-1)
    return torch.argsort(flat, stable=True), torch.bincount(flat, minlength=n_experts)


class GroupedExperts(nn.Module):
    """The local experts of a helpers.MoE (Linear, GELU, Linear each) as stacked weights:
    w1 (E, width, hidden), b1 (E, hidden), w2 (E, hidden, width), b2 (E, width); rows arrive
    grouped by expert (counts) and run as two grouped GEMMs. `mesh`: the weights become
    DTensors sharded over it (each rank holds its experts: Shard(0)), as torchtitan keeps
    them."""

    def __init__(self, experts, mesh=None, first=0):
        super().__init__()
        stack = lambda ts: torch.stack([t.detach().clone() for t in ts])
        local = {"w1": stack(e[0].weight.t() for e in experts),
                 "b1": stack(e[0].bias for e in experts),
                 "w2": stack(e[2].weight.t() for e in experts),
                 "b2": stack(e[2].bias for e in experts)}
        self.first, self.mesh = first, mesh
        for name, t in local.items():
            if mesh is not None:
                from torch.distributed.tensor import DTensor, Replicate, Shard
                placements = [Replicate()] * (mesh.ndim - 1) + [Shard(0)]
                t = DTensor.from_local(t.to(mesh.device_type), mesh, placements,
                                       run_check=False)
            setattr(self, name, nn.Parameter(t))

    def _local(self, name):
        t = getattr(self, name)
        return t.to_local() if hasattr(t, "to_local") else t

    def forward(self, x, counts):
        w1, b1, w2, b2 = (self._local(n) for n in ("w1", "b1", "w2", "b2"))
        idx = torch.repeat_interleave(torch.arange(len(counts), device=x.device),
                                      torch.as_tensor(counts, device=x.device))
        h = F.gelu(grouped_mm(x, w1, counts) + b1[idx])
        return grouped_mm(h, w2, counts) + b2[idx]


def ep_dp_mesh(world, ep, device_type="cpu"):
    """The (dp, ep) device mesh of `world` ranks, ep consecutive ranks splitting the experts."""
    if world % ep:
        raise ValueError(f"ep={ep} does not divide the {world} ranks")
    return device_mesh((world // ep, ep), ("dp", "ep"), device_type)


class EPMoE(nn.Module):
    """This rank's part of a dropless helpers.MoE (the same on every rank), torchtitan's way,
    on the "ep" dimension of `mesh` (ep_dp_mesh): the router and the shared expert are
    replicas; experts ep_rank * E/ep .. are GroupedExperts. forward(x) routes this rank's
    tokens, permutes them by expert, exchanges the counts, dispatches with
    all_to_all_single_autograd, runs the grouped experts, combines the same way back and
    weights the rows by the router. Returns (y, aux) as MoE does, plus aux["sent_bytes"]
    (the rows its two all-to-alls sent to other ranks) and aux["grouped_mm"] (what ran)."""

    def __init__(self, moe, mesh):
        super().__init__()
        if moe.capacity_factor is not None:
            raise ValueError("EPMoE is dropless, as torchtitan's: build the MoE with "
                             "capacity_factor=None")
        self.mesh, self.group = mesh, mesh["ep"].get_group()
        self.ep, E = mesh["ep"].size(), moe.n_experts
        if E % self.ep:
            raise ValueError(f"{E} experts do not spread evenly over {self.ep} ranks")
        self.E, self.k, self.local = E, moe.k, E // self.ep
        self.router, self.shared = moe.router, moe.shared
        self.first = mesh["ep"].get_local_rank() * self.local
        self.experts = GroupedExperts(moe.experts[self.first:self.first + self.local],
                                      mesh["ep"], self.first)

    def forward(self, x):
        from torch.distributed._functional_collectives import all_to_all_single_autograd
        ep, E, L = self.ep, self.E, self.local
        logits = self.router(x)
        probs = logits.softmax(-1)
        top_p, expert = probs.topk(self.k, dim=-1)
        gate = top_p / top_p.sum(-1, keepdim=True) if self.k > 1 else top_p
        order, counts = permute_by_expert(expert, E)
        token = order // self.k
        # counts first: how many rows of each of my local experts every rank will send
        got_counts = torch.empty_like(counts)
        dist.all_to_all_single(got_counts, counts, group=self.group)
        got_counts = got_counts.view(ep, L)
        send = counts.view(ep, L).sum(1).tolist()
        recv = got_counts.sum(1).tolist()
        rows = all_to_all_single_autograd(x[token], recv, send, self.group)
        # received: by source rank, then local expert; the grouped GEMM wants expert-major
        src_expert = torch.arange(ep * L, device=x.device).view(ep, L) % L
        by_expert = torch.argsort(torch.repeat_interleave(src_expert.reshape(-1),
                                                          got_counts.reshape(-1)), stable=True)
        out = self.experts(rows[by_expert], got_counts.sum(0).tolist())[torch.argsort(by_expert)]
        back = all_to_all_single_autograd(out, send, recv, self.group)
        y = x.new_zeros(x.shape) if self.shared is None else self.shared(x)
        y = y.index_add(0, token, gate.reshape(-1)[order][:, None] * back)
        row = x.shape[1] * x.element_size()
        sent = (sum(send) - send[self.mesh["ep"].get_local_rank()]
                + sum(recv) - recv[self.mesh["ep"].get_local_rank()]) * row
        aux = dict(loss=load_balancing_loss(probs, expert, E), z_loss=router_z_loss(logits),
                   dropped=0, tokens_per_expert=counts, received=got_counts.sum(0),
                   sent_bytes=sent, grouped_mm=grouped_mm_status(x.device)[1])
        return y, aux

    def reduce_gradients(self):
        """Sum the gradients over the ranks that hold the same parameters: the experts' over
        the "dp" dimension (world / ep ranks), the router's and shared expert's over all."""
        for p in self.experts.parameters():
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            dist.all_reduce(g, group=self.mesh["dp"].get_group())
        dense = list(self.router.parameters()) + (list(self.shared.parameters())
                                                  if self.shared is not None else [])
        for p in dense:
            dist.all_reduce(p.grad)
