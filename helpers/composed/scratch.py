"""Part VII: the small GPT on a 3-D mesh (pipeline x data x tensor), from the course's own pieces.

Nothing here is new machinery; it is composition, in a fixed order (`train_3d_scratch`, in
experiments.py, runs it):
1. groups: one process group per row of each mesh dimension (`new_groups`, built once);
2. pipeline: this rank's stage of the layers (helpers.stage_of), run with the 1F1B order of
   helpers.pipeline_rank_step over the "pp" group;
3. tensor parallel: every block of the stage replaced by its helpers.TPBlock over the "tp"
   group (Megatron's f and g);
4. data parallel: the stage wrapped in helpers.DDPFromScratch over the "dp" group, gradients
   accumulated over the micro-batches (no_sync) and all-reduced once per step.
The same GPT with its sequence split over a "cp" group (`cp_gpt`: the zig-zag split, ring
attention in every block, each block optionally recomputed in backward) is what the planner's
other axes are checked on.
"""
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..context_parallel.scratch import CPAttention, split_positions

# the course's pieces, composed
from ..pipeline_parallel.scratch import stage_of
from ..runtime.launch import take, take_kwargs
from ..tensor_parallel.scratch import TPBlock
from ..tiny_models import SmallBlock
from .model import GPTHead, gpt, gpt_batches, gpt_layers, gpt_loss

__all__ = ["build_stage", "one_process_run", "cp_gpt"]


def build_stage(net, cuts, pp_rank, tp_comm):
    """This rank's pipeline stage of `net` (gpt_layers), each block tensor parallel over tp_comm
    (a TPBlock holding this rank's heads and slices; a world-1 comm keeps them whole)."""
    stage = stage_of(net, cuts, pp_rank)
    for i, layer in enumerate(stage):
        if isinstance(layer, SmallBlock):
            stage[i] = TPBlock(layer, tp_comm)
    return stage


def _optimizer(params, lr):
    """SGD with momentum: Adam would turn rounding noise in near-zero gradients into full-size
    steps (it divides by the gradient's own size), and the runs could not be compared."""
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def one_process_run(cfg):
    """The reference: the same GPT, batches and SGD steps in one process, whole batches
    (cfg: that of train_3d_scratch, train_3d_torch or train_cp_zero2; the mesh's keys are not
    read). Returns (losses, {name in gpt_layers: weight})."""
    model_cfg, batch, steps, lr, *_mesh = take(cfg, "model", "batch", "steps", lr=0.05,
                                               shape=None, m=None, recomputes=None)
    model_cfg = take_kwargs(model_cfg, gpt)
    net = gpt_layers(gpt(**model_cfg))
    opt = _optimizer(net.parameters(), lr)
    losses = []
    for X, y in gpt_batches(steps, batch, model_cfg["seq"], model_cfg["vocab"]):
        loss = gpt_loss(net(X), y) / len(X)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses, {n: p.detach().clone() for n, p in net.named_parameters()}


class _CPEmbed(nn.Module):
    """Token plus position embeddings of this rank's tokens of the sequence (their global
    positions, `positions`: not a buffer, which data parallelism would copy from rank 0)."""

    def __init__(self, lm, positions):
        super().__init__()
        self.tok, self.pos, self.positions = lm.tok, lm.pos, positions

    def forward(self, idx):
        return self.tok(idx) + self.pos(self.positions.to(idx.device))


class _CPBlock(nn.Module):
    """A SmallBlock on this rank's tokens (the same modules): its attention a ring over `comm`
    (helpers.context_parallel.scratch.CPAttention); the norms and the MLP need no other token."""

    def __init__(self, block, comm, layout="zigzag"):
        super().__init__()
        self.ln1, self.ln2, self.mlp = block.ln1, block.ln2, block.mlp
        self.attn = CPAttention(block.attn, comm, layout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class _Recomputed(nn.Module):
    """`module` under activation recomputation: backward runs its forward again (its ring
    included) instead of keeping what it saved; only its input is kept."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return checkpoint(self.module, x, use_reentrant=False)


def cp_gpt(lm, comm, recompute="none", layout="zigzag"):
    """The GPT (a gpt()) on this rank's tokens of a sequence split over `comm` by `layout`:
    _CPEmbed, its blocks as _CPBlock (each _Recomputed with recompute="full"), GPTHead."""
    if recompute not in ("none", "full"):
        raise ValueError(f"recompute must be 'none' or 'full', not {recompute!r}")
    pos = split_positions(lm.pos.num_embeddings, comm.world, comm.rank, layout)
    blocks = [_CPBlock(b, comm, layout) for b in lm.blocks]
    if recompute == "full":
        blocks = [_Recomputed(b) for b in blocks]
    return nn.Sequential(_CPEmbed(lm, pos), *blocks, GPTHead(lm))
