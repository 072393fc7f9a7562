"""Part VII: expert parallelism by hand. Each rank holds E / world of the experts (and a copy of
the router) and routes its own tokens; an all-to-all sends every token to the rank of its
expert (dispatch), the experts run, and a second all-to-all brings the results back (combine).
Backward runs the same two exchanges in reverse.

With a capacity factor every rank sends a fixed (E, capacity, width) buffer: the bytes are
known in advance, overflowing tokens are dropped, empty slots travel as zeros. Without one
(dropless), the ranks first exchange how many tokens they will send, and a popular expert's
rank receives (and computes) more than the others.
"""
import torch
from torch import nn

from .moe import expert_capacity, load_balancing_loss, route, router_z_loss

__all__ = ["AllToAll", "ExpertParallelMoE"]


class AllToAll(torch.autograd.Function):
    """`comm.all_to_all` with a gradient: backward sends the gradients back the way the rows
    came."""

    @staticmethod
    def forward(ctx, x, comm, in_splits, out_splits):
        ctx.comm, ctx.splits = comm, (in_splits, out_splits)
        return comm.all_to_all(x, in_splits, out_splits)

    @staticmethod
    def backward(ctx, grad):
        in_splits, out_splits = ctx.splits
        return ctx.comm.all_to_all(grad.contiguous(), out_splits, in_splits), None, None, None


class ExpertParallelMoE(nn.Module):
    """Rank comm.rank's part of `moe` (a helpers.MoE, the same on every rank): the router (a
    replica: average or sum its gradient over the ranks, as data parallelism does) and experts
    rank * E/world .. (rank + 1) * E/world - 1. forward(x) takes this rank's tokens (one group of
    the unsplit layer) and returns (y, aux) as MoE does, plus aux["received"]: tokens each local
    expert computed, and aux["sent_bytes"]: what this rank's all-to-alls sent."""

    def __init__(self, moe, comm):
        super().__init__()
        E, w = moe.n_experts, comm.world
        if E % w:
            raise ValueError(f"{E} experts do not spread evenly over {w} ranks")
        self.comm, self.E, self.k, self.factor = comm, E, moe.k, moe.capacity_factor
        self.local = E // w
        self.router, self.shared = moe.router, moe.shared
        first = comm.rank * self.local
        self.experts = nn.ModuleList(moe.experts[first:first + self.local])

    def _validate_ranks_agree(self, x):
        """Refuse, on every rank at once, tokens the ranks cannot exchange: a different width
        anywhere, or (fixed buffers, sized from the tokens) a different number of tokens.
        One exchange of two integers per rank, logged as "counts"."""
        comm = self.comm
        mine = torch.tensor([[x.shape[0], x.shape[-1]]], device=x.device).repeat(comm.world, 1)
        got = comm.all_to_all(mine, [1] * comm.world, [1] * comm.world, tag=302,
                              op="counts").tolist()
        held = ", ".join(f"rank {r}: {t} x {d}" for r, (t, d) in enumerate(got))
        if len({d for _, d in got}) > 1:
            raise ValueError(f"expert parallelism needs the same token width on every rank; "
                             f"the ranks hold (tokens x width) {held}")
        if self.factor is not None and len({t for t, _ in got}) > 1:
            raise ValueError(f"expert parallelism with a capacity factor needs the same number "
                             f"of tokens on every rank (its buffers are sized from it); the "
                             f"ranks hold (tokens x width) {held}: give every rank an equal "
                             f"share, or use capacity_factor=None (dropless)")

    def _run_experts(self, rows, per_expert):
        """rows: everything received, grouped by source rank then local expert; per_expert:
        (world, local) row counts. Returns the outputs in the same order."""
        counts = per_expert.reshape(-1).tolist()
        chunks = list(rows.split(counts))
        outs = list(chunks)
        for e, expert in enumerate(self.experts):
            idx = [s * self.local + e for s in range(self.comm.world)]
            x = torch.cat([chunks[i] for i in idx])
            # run even on 0 rows: the output then has a grad_fn, so the combine's backward
            # all-to-all runs on every rank, in the same order
            y = expert(x)
            for i, part in zip(idx, y.split([counts[i] for i in idx]), strict=True):
                outs[i] = part
        return torch.cat(outs)

    def forward(self, x):
        comm, w, E = self.comm, self.comm.world, self.E
        start = comm.traffic.mark()
        self._validate_ranks_agree(x)
        logits = self.router(x)
        r = route(logits, self.k, expert_capacity(len(x), E, self.k, self.factor))
        tok, choice = torch.nonzero(r["kept"], as_tuple=True)
        expert, gate = r["expert"][tok, choice], r["gate"][tok, choice][:, None]
        if self.factor is not None:            # fixed buffers: (E, capacity, width)
            C = expert_capacity(len(x), E, self.k, self.factor)
            pos = expert * C + r["slot"][tok, choice]
            buf = x.new_zeros(E * C, x.shape[1]).index_add(0, pos, x[tok])
            splits = [self.local * C] * w
            got = AllToAll.apply(buf, comm, splits, splits)
            per_expert = torch.full((w, self.local), C)
            out = AllToAll.apply(self._run_experts(got, per_expert), comm, splits, splits)
            back = out[pos]
            # the real tokens among the slots each local expert computed (for the record)
            received = _exchange_counts(comm, torch.bincount(expert, minlength=E),
                                        self.local).sum(0)
        else:                                  # dropless: variable splits, counts first
            order = torch.argsort(expert, stable=True)
            tok, expert, gate = tok[order], expert[order], gate[order]
            counts = torch.bincount(expert, minlength=E)
            real = _exchange_counts(comm, counts, self.local)      # (world, local) to receive
            send_splits = counts.view(w, self.local).sum(1).tolist()
            recv_splits = real.sum(1).tolist()
            got = AllToAll.apply(x[tok], comm, send_splits, recv_splits)
            out = AllToAll.apply(self._run_experts(got, real), comm, recv_splits, send_splits)
            back, received = out, real.sum(0)
        y = (x.new_zeros(x.shape) if self.shared is None else self.shared(x)).index_add(
            0, tok, gate * back)
        sent = comm.traffic.since(start).wire_bytes("all_to_all")
        aux = dict(loss=load_balancing_loss(r["probs"], r["expert"], E),
                   z_loss=router_z_loss(logits),
                   dropped=int((~r["kept"]).sum()), tokens_per_expert=torch.bincount(
                       r["expert"][r["kept"]], minlength=E), received=received,
                   sent_bytes=sent)
        return y, aux


def _exchange_counts(comm, counts, local):
    """Each rank's tokens per expert (E,) -> what this rank's `local` experts get from each rank,
    (world, local). Logged as "counts" (a few integers), apart from the tokens' bytes."""
    got = comm.all_to_all(counts.view(comm.world, local), [1] * comm.world, [1] * comm.world,
                          tag=301, op="counts")
    return got.view(comm.world, local)
