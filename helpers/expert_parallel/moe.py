"""Part VII: a mixture-of-experts layer in one process, the reference for expert parallelism.

A router (one linear layer) scores every token against E experts (small MLPs); each token goes
to its top-k experts, weighted by the router's probabilities. Each expert takes at most
`capacity` tokens of a group (capacity factor x tokens x k / E, GShard's rule): the rest are
dropped, first choices before second ones, earlier tokens first; a dropped choice adds nothing
(the residual connection around the layer carries the token on). The load-balancing loss of
Switch Transformers (E x sum_i f_i P_i) is smallest when the experts share the tokens evenly;
ST-MoE's router z-loss (the mean squared log-sum-exp of the router's scores) keeps those
scores small, so the softmax stays away from float overflow. A shared expert (DeepSeek-MoE)
sees every token, beside the routed ones.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..seeding import seeded
from ..validate import validate_positive_int

__all__ = ["expert_capacity", "route", "load_balancing_loss", "router_z_loss", "MoE",
           "moe_inputs"]


def expert_capacity(tokens, n_experts, k, factor):
    """Slots per expert for a group of `tokens`: ceil(factor * tokens * k / n_experts);
    None (no limit: nothing dropped) when factor is None."""
    validate_positive_int(n_experts, "n_experts")
    validate_positive_int(k, "k")
    if k > n_experts:
        raise ValueError(f"k={k} experts per token but only {n_experts} experts: k <= n_experts")
    if factor is None:
        return None
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or \
            not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"capacity factor must be a finite number > 0 (or None for no "
                         f"limit), not {factor!r}")
    return math.ceil(factor * tokens * k / n_experts)


def route(logits, k, capacity):
    """Top-k routing of one group of tokens (logits: (N, E)). Returns dict(probs (N, E),
    expert (N, k), gate (N, k): the weights, renormalised over the k choices when k > 1,
    slot (N, k): the place of each choice in its expert's queue, kept (N, k) bool)."""
    probs = logits.softmax(-1)
    top_p, expert = probs.topk(k, dim=-1)
    gate = top_p / top_p.sum(-1, keepdim=True) if k > 1 else top_p
    one_hot = F.one_hot(expert.t().reshape(-1), logits.shape[-1])   # choice-major order
    slot = ((one_hot.cumsum(0) - 1) * one_hot).sum(-1).view(k, -1).t()
    kept = torch.ones_like(slot, dtype=torch.bool) if capacity is None else slot < capacity
    return dict(probs=probs, expert=expert, gate=gate, slot=slot, kept=kept)


def load_balancing_loss(probs, expert, n_experts):
    """Switch Transformer's auxiliary loss: E * sum_i f_i * P_i, f_i the share of the routed
    choices that picked expert i, P_i the mean router probability of expert i. 1 when balanced."""
    f = torch.bincount(expert.reshape(-1), minlength=n_experts).float() / expert.numel()
    return n_experts * (f * probs.mean(0)).sum()


def router_z_loss(logits):
    """ST-MoE's router z-loss: the mean over tokens of logsumexp(scores)^2. It is small when
    the router's scores are: the exponentials of large scores lose precision in bfloat16 (and
    overflow in float16)."""
    return (torch.logsumexp(logits.float(), -1) ** 2).mean()


def _expert(width, hidden):
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))


class MoE(nn.Module):
    """A top-k MoE layer on tokens x (N, width). The tokens are cut into `groups` equal groups
    (in expert parallelism: one per rank), each routed with its own capacity. forward returns
    (y, aux) with aux = dict(loss (the mean of the groups' load-balancing losses), z_loss (the
    mean of their router z-losses), dropped (choices dropped), tokens_per_expert (kept
    choices)). shared_hidden > 0 adds a shared expert of that hidden width on every token."""

    def __init__(self, width=16, hidden=32, n_experts=4, k=2, capacity_factor=1.25, seed=0,
                 shared_hidden=0):
        super().__init__()
        self.n_experts, self.k, self.capacity_factor = n_experts, k, capacity_factor
        expert_capacity(1, n_experts, k, capacity_factor)      # a bad factor: refused now
        # the same weights for every seed, even when thread ranks build their copies at once
        with seeded(seed):
            self.router = nn.Linear(width, n_experts)
            self.experts = nn.ModuleList(_expert(width, hidden) for _ in range(n_experts))
            self.shared = _expert(width, shared_hidden) if shared_hidden else None

    def forward(self, x, groups=1):
        if x.shape[0] % groups:
            raise ValueError(f"{x.shape[0]} tokens do not cut into {groups} equal groups")
        ys, losses, zs, dropped = [], [], [], 0
        counts = torch.zeros(self.n_experts, dtype=torch.long)
        for xg in x.chunk(groups):
            logits = self.router(xg)
            r = route(logits, self.k,
                      expert_capacity(len(xg), self.n_experts, self.k, self.capacity_factor))
            y = torch.zeros_like(xg) if self.shared is None else self.shared(xg)
            for e, expert in enumerate(self.experts):
                tok, choice = torch.nonzero((r["expert"] == e) & r["kept"], as_tuple=True)
                if len(tok):
                    w = r["gate"][tok, choice][:, None]
                    y = y.index_add(0, tok, w * expert(xg[tok]))
                counts[e] += len(tok)
            ys.append(y)
            losses.append(load_balancing_loss(r["probs"], r["expert"], self.n_experts))
            zs.append(router_z_loss(logits))
            dropped += int((~r["kept"]).sum())
        return torch.cat(ys), dict(loss=torch.stack(losses).mean(), z_loss=torch.stack(zs).mean(),
                                   dropped=dropped, tokens_per_expert=counts)


def moe_inputs(tokens, width, seed=0):
    """Tokens X (tokens, width) and the weights R of the loss (y * R).sum(), same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, width, generator=g), torch.randn(tokens, width, generator=g)
