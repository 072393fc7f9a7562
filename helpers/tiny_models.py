"""Part V: small models where sharding matters yet which train on 2 CPU cores.

`deep_mlp`: many equal layers, so the parameters (not the activations) dominate memory.
`TinyLM`: a decoder-only transformer (tied input/output embedding) on a synthetic next-token task.
"""
import inspect
import math

import torch
from torch import nn
from torch.nn import functional as F

from .seeding import seeded

__all__ = ["deep_mlp", "TinyLM", "TinyBlock", "counting_tokens", "model_bytes", "make_model",
           "make_batches", "SmallMLP", "SmallAttention", "SmallBlock", "small_block",
           "small_stack", "block_inputs", "block_loss"]


def deep_mlp(d_in=32, width=64, depth=4, num_classes=10):
    """`depth` hidden Linear+ReLU layers of `width`, then a classifier: parameters ~
    depth*width^2."""
    layers, d = [], d_in
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    return nn.Sequential(*layers, nn.Linear(d, num_classes))


class TinyBlock(nn.Module):
    """Pre-norm transformer block: causal self-attention then an MLP, each with a residual."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.up, self.down = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        n, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(n, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.n_heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(n, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TinyLM(nn.Module):
    """A decoder-only transformer: token + position embeddings, `n_layers` blocks, a final norm and
    an output head that shares the token embedding's weight when `tied` (as GPT-2 does).
    `make_block(d_model, n_heads)` builds each block (default TinyBlock; Part VII passes
    tiny_models.SmallBlock, whose separate q, k, v split by heads for tensor parallelism)."""

    def __init__(self, vocab=32, d_model=32, n_layers=2, n_heads=2, seq_len=16, tied=True,
                 make_block=TinyBlock):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(make_block(d_model, n_heads) for _ in range(n_layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        for emb in (self.tok, self.pos):   # GPT-2's init: small embeddings, logits near zero
            nn.init.normal_(emb.weight, std=0.02)
        if tied:
            self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def counting_tokens(n, seq_len=16, vocab=32, seed=0):
    """n sequences that count up mod `vocab` from a random start with a random stride in 1..3:
    the next token is predictable from the previous two. Returns (inputs, targets), each
    (n, seq_len)."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(vocab, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    seq = (start + stride * torch.arange(seq_len + 1)) % vocab
    return seq[:, :-1], seq[:, 1:]


def model_bytes(module):
    """Bytes of a module's parameters, each shared (tied) tensor counted once."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


# ---- the models and batches of Part V's experiments --------------------------------------
def make_model(kind, seed=0, **sizes):
    """The experiments' models: "mlp" (deep MLP), "frozen" (its first layer frozen), "tied"
    (TinyLM with tied embeddings), "lm" (TinyLM, untied)."""
    if kind not in ("mlp", "frozen", "tied", "lm"):
        raise ValueError(f"unknown model kind {kind!r}: use mlp, frozen, tied or lm")
    with seeded(seed):
        if kind in ("tied", "lm"):
            return TinyLM(tied=kind == "tied", **sizes)
        net = deep_mlp(**sizes)
    if kind == "frozen":
        net[0].requires_grad_(False)
    return net


def make_batches(kind, num_steps, batch_size, seed=1, **sizes):
    """The same `num_steps` global batches on every rank: a list of (X, y). An MLP's inputs are
    as wide as make_model(kind, **sizes) takes them (its d_in; deep_mlp's default where absent)."""
    d_in = sizes.get("d_in", inspect.signature(deep_mlp).parameters["d_in"].default)
    g = torch.Generator().manual_seed(seed)
    if kind in ("tied", "lm"):
        X, y = counting_tokens(num_steps * batch_size, seed=seed)
        return list(zip(X.split(batch_size), y.split(batch_size), strict=True))
    return [(torch.randn(batch_size, d_in, generator=g),
             torch.randint(10, (batch_size,), generator=g))
            for _ in range(num_steps)]


# --- the small transformer block (the unsplit reference) --------------------------------------
class SmallMLP(nn.Module):
    """Linear up to `hidden`, GELU, linear back down."""

    def __init__(self, width, hidden):
        super().__init__()
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class SmallAttention(nn.Module):
    """Causal self-attention with separate q, k, v projections (so each can be split by whole
    heads). The head count comes from the tensor: a rank holding half the heads just works."""

    def __init__(self, width, heads):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} must be a multiple of heads {heads}")
        self.head_dim = width // heads
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (lin(x).view(B, T, -1, self.head_dim).transpose(1, 2)
                   for lin in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


class SmallBlock(nn.Module):
    """A pre-norm transformer block: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, width=32, heads=4, hidden=None):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn, self.mlp = SmallAttention(width, heads), SmallMLP(width, hidden or 4 * width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def small_block(width=32, heads=4, hidden=None, seed=0):
    """The SmallBlock with weights from `seed` (every rank builds the same one)."""
    with seeded(seed):
        return SmallBlock(width, heads, hidden)


def small_stack(blocks=2, width=32, heads=4, seed=0):
    """`blocks` SmallBlocks in an nn.Sequential, weights from `seed` (every rank builds the
    same): a model with more than one block, so each can be its own FSDP unit."""
    with seeded(seed):
        return nn.Sequential(*[SmallBlock(width, heads) for _ in range(blocks)])


def block_inputs(batch, seq, width, seed=0):
    """Input X (batch, seq, width) and the weights R of the loss (out * R).sum()."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, width, generator=g), torch.randn(batch, seq, width, generator=g)


def block_loss(out, R):
    """A loss whose gradient reaches every output element differently."""
    return (out * R).sum()
