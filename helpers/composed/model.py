"""Part VII: the small GPT of the 3-D runs (its mesh is laid out by helpers.runtime.mesh).

The model is the course's TinyLM (helpers.tiny_models) with its SmallBlock blocks (separate
q, k, v, so tensor parallelism splits whole heads) and an untied head (a pipeline puts the
embedding and the head on different ranks). `gpt_layers` lays it out as an nn.Sequential
(embedding, blocks, head) for the pipeline to cut.
"""
import torch
import torch.nn.functional as F
from torch import nn

from ..seeding import seeded
from ..tiny_models import SmallBlock, TinyLM, counting_tokens
from ..validate import validate_positive_int

__all__ = ["gpt", "gpt_layers", "GPTEmbed", "GPTHead", "gpt_loss", "gpt_batches",
           "stage_cuts", "validate_data_split"]



def gpt(vocab=32, width=32, layers=4, heads=4, seq=16, seed=0):
    """The 3-D runs' decoder-only transformer (the same weights from the same seed)."""
    with seeded(seed):
        return TinyLM(vocab, width, layers, heads, seq, tied=False, make_block=SmallBlock)


class GPTEmbed(nn.Module):
    """Token plus position embeddings (the TinyLM's own modules)."""

    def __init__(self, lm):
        super().__init__()
        self.tok, self.pos = lm.tok, lm.pos

    def forward(self, idx):
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class GPTHead(nn.Module):
    """The final layer norm and the output projection to the vocabulary."""

    def __init__(self, lm):
        super().__init__()
        self.ln, self.head = lm.ln, lm.head

    def forward(self, x):
        return self.head(self.ln(x))


def gpt_layers(lm):
    """The TinyLM as an nn.Sequential: GPTEmbed, its blocks, GPTHead (the same modules)."""
    return nn.Sequential(GPTEmbed(lm), *lm.blocks, GPTHead(lm))


def gpt_loss(out, y):
    """Next-token cross-entropy summed over the rows, averaged over the positions: divided by
    the number of sequences it is the mean loss per token."""
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1),
                           reduction="sum") / y.shape[-1]


def gpt_batches(steps, batch, seq=16, vocab=32, seed=1):
    """`steps` global batches (X, y) of counting sequences, the same on every rank."""
    X, y = counting_tokens(steps * batch, seq_len=seq, vocab=vocab, seed=seed)
    return list(zip(X.split(batch), y.split(batch), strict=True))


def validate_data_split(batch, dp):
    """Refuse a global batch that does not split into dp equal shares: each data-parallel rank
    averages its own rows, so unequal shares would weight the sequences unequally."""
    validate_positive_int(batch, "batch", fix="how many sequences")
    if batch % dp:
        raise ValueError(f"a global batch of {batch} sequences does not split over dp={dp} "
                         f"data-parallel ranks: use a multiple of {dp} (each rank averages "
                         f"its own share, so the shares must be equal)")


def stage_cuts(layers, pp):
    """Cuts of gpt_layers (layers blocks between the embedding and the head) into pp stages:
    equal numbers of blocks, the embedding with the first, the head with the last."""
    if layers % pp:
        raise ValueError(f"{layers} blocks do not split into {pp} equal pipeline stages")
    return [1 + i * layers // pp for i in range(1, pp)]
