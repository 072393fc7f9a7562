"""Part V: ZeRO in mixed precision, the case the ZeRO paper's numbers describe: bfloat16 weights
and gradients on every rank (2 + 2 bytes per parameter), float32 master weights and AdamW state
for this rank's flat 1/k only (12/k bytes).
"""
import torch
import torch.distributed as dist
from torch import nn

from .flat import all_gather_flat, padded_flat, reduce_scatter_flat

__all__ = ["MixedPrecisionZero"]


class MixedPrecisionZero:
    """ZeRO-1 over a low-precision module: `module`'s trainable parameters become views of one
    flat low-precision buffer; this rank keeps a float32 master copy of its slice and AdamW's
    state for it. `step()` reduce-scatters the gradients in float32 (as reduce_dtype=float32
    does), steps the master slice, and all-gathers it, rounded to the module's dtype.
    Usage: `loss.backward(); opt.step(); opt.zero_grad()`."""

    def __init__(self, module, lr=1e-3, weight_decay=0.0):
        if not dist.is_initialized():
            raise RuntimeError("MixedPrecisionZero needs a process group: call helpers.setup() "
                               "first")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.params = [p for p in module.parameters() if p.requires_grad]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1 or dtypes == {torch.float32}:
            raise ValueError(f"MixedPrecisionZero wants a module in one low precision (e.g. "
                             f"module.to(torch.bfloat16)), got {sorted(map(str, dtypes))}")
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)
        self.flat = padded_flat(self.params, self.world)
        offset = 0
        for p in self.params:
            p.data = self.flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        self.master = nn.Parameter(self.flat.chunk(self.world)[self.rank].float().clone())
        self.optimizer = torch.optim.AdamW([self.master], lr=lr, weight_decay=weight_decay)

    @torch.no_grad()
    def step(self):
        full = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.params]).float()   # reduced in float32
        full = torch.cat([full, full.new_zeros(-full.numel() % self.world)])
        out = full.new_empty(full.numel() // self.world)
        reduce_scatter_flat(out, full).wait()
        self.master.grad = out.div_(self.world)
        self.optimizer.step()
        gathered, _ = all_gather_flat(self.master.detach().to(self.flat.dtype), self.world)
        self.flat.copy_(gathered)

    def zero_grad(self):
        self.optimizer.zero_grad()
        for p in self.params:
            p.grad = None

    def held_bytes(self):
        """{what: bytes this rank holds}: low-precision weights and gradients (full), float32
        master slice and optimizer state (1/k)."""
        state = sum(v.numel() * v.element_size() for s in self.optimizer.state.values()
                    for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
        return dict(weights=sum(p.numel() * p.element_size() for p in self.params),
                    grads=sum(p.grad.numel() * p.grad.element_size() for p in self.params
                              if p.grad is not None),
                    master=self.master.numel() * 4, optim=state)
