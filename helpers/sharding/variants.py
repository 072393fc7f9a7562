"""Part V: ZeRO's variants, costed with the course's model, and qwZ's quantization built (the
runs across processes are in variants_experiments.py).

ZeRO-R (Rajbhandari et al., 2020, sec. 6): checkpointed activations partitioned over the
tensor-parallel ranks, constant-size fused buffers, memory kept unfragmented. ZeRO-Offload and
Infinity: the optimizer step on the host (run with FSDP2's `CPUOffloadPolicy`), counting
what would cross PCIe. ZeRO++ (Wang et al., 2023): quantized weights (qwZ), a secondary weight
shard per node (hpZ), quantized gradients (qgZ); qwZ's block quantization built and gathered.
"""
import torch

from ..costs import ring_bytes_per_device, ring_pass_bytes, sharding_costs
from ..data_parallel.scratch import make_buckets
from ..transformer_costs import activation_bytes_per_token
from .flat import all_gather_flat

__all__ = ["activation_partition_costs", "fused_buffer_bytes", "offload_costs", "quantize_blocks",
           "dequantize_blocks", "quantization_bound", "quantized_all_gather", "zeropp_costs",
           "variant_memory", "variant_traffic", "plot_variants"]


# ---------------------------------------------------------------- ZeRO-R
def activation_partition_costs(width, heads, seq, layers, batch, tp, dtype_bytes=2):
    """Checkpointed activations (one block input kept per layer, `recompute="full"`) per
    tensor-parallel rank, whole (Megatron keeps it on every rank) and partitioned (ZeRO-R's Pa:
    1/tp each, all-gathered before each layer's recomputation); the bytes a rank sends for Pa's
    all-gathers, against tensor parallelism's own all-reduces of the same (b, s, h) tensor
    (2 in forward, 2 in backward, 2 more when the forward is recomputed)."""
    tokens = batch * seq
    kept = layers * tokens * activation_bytes_per_token(
        width, heads, seq, tp, sp=False, recompute="full", dtype_bytes=dtype_bytes)
    part = layers * tokens * activation_bytes_per_token(
        width, heads, seq, tp, sp=True, recompute="full", dtype_bytes=dtype_bytes)
    one = tokens * width * dtype_bytes             # one (b, s, h) activation
    pa_sent = layers * ring_pass_bytes(one, tp)     # an all-gather's share: half a ring
    tp_sent = layers * 6 * ring_bytes_per_device(one, tp)
    return dict(kept_bytes=kept, partitioned_bytes=part, pa_sent_bytes=pa_sent,
                tp_sent_bytes=tp_sent)


def fused_buffer_bytes(params, bucket_mb=None, dtype_bytes=4):
    """The largest flat buffer a fused reduction needs: the whole model's gradients when
    bucket_mb is None (one model-sized buffer), else the largest of `make_buckets`' buckets
    (ZeRO-R's constant-size buffers, DDP's and Zero2's buckets)."""
    params = [p for p in params if p.requires_grad]
    if bucket_mb is None:
        return sum(p.numel() for p in params) * dtype_bytes
    return max(sum(p.numel() for p in b) for b in make_buckets(params, bucket_mb)) * dtype_bytes


# ---------------------------------------------------------------- ZeRO-Offload / Infinity
def offload_costs(n_params, world, dtype_bytes=4, optimizer="adam", gathers=2):
    """Per rank and step with FSDP2's CPUOffloadPolicy: the host keeps the weight, gradient and
    optimizer shards (the device none between steps); before each of the `gathers` all-gathers
    (forward, and backward again when resharded) the weight shard is copied host to device, and
    after the reduce-scatter the gradient shard device to host."""
    z3 = sharding_costs(n_params, world, "zero3", optimizer, dtype_bytes)
    return dict(host_bytes=z3["total_bytes"], device_state_bytes=0.0,
                on_device_without=z3["total_bytes"], h2d_bytes=gathers * z3["params_bytes"],
                d2h_bytes=z3["grads_bytes"])


# ---------------------------------------------------------------- ZeRO++
def quantize_blocks(x, block=256, bits=8):
    """Symmetric block quantization: x flattened and zero-padded to whole blocks, each block
    divided by its own scale (its largest |value| / (2**(bits-1) - 1)) and rounded to int8.
    Returns (q: int8, scales: float32, one per block)."""
    if bits not in (4, 8) or int(block) != block or block < 1:
        raise ValueError(f"need bits 4 or 8 and a block of at least 1 element, got {bits}, "
                         f"{block}")
    flat = x.detach().reshape(-1).float()
    flat = torch.cat([flat, flat.new_zeros(-flat.numel() % block)]).view(-1, block)
    qmax = 2 ** (bits - 1) - 1
    scales = flat.abs().amax(1) / qmax
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(flat / safe[:, None]).clamp(-qmax, qmax).to(torch.int8)
    return q.reshape(-1), scales


def dequantize_blocks(q, scales, numel=None):
    """The float32 values of quantize_blocks' (q, scales), the first `numel` of them."""
    out = (q.view(scales.numel(), -1).float() * scales[:, None]).reshape(-1)
    return out if numel is None else out[:numel]


def quantization_bound(x, block=256, bits=8):
    """The largest error round-to-nearest can make on x: half a step of the coarsest block."""
    return float(quantize_blocks(x, block, bits)[1].max()) / 2


def quantized_all_gather(shard, world, block=256):
    """qwZ: every rank's `shard` gathered as int8 values plus one float32 scale per block
    (through all_gather_flat), dequantized: about (1 + 4/block)/4 of float32's bytes."""
    q, scales = quantize_blocks(shard, block)
    qs, work = all_gather_flat(q, world)
    ss, work2 = all_gather_flat(scales, world)
    per_q, per_s = q.numel(), scales.numel()
    return torch.cat([dequantize_blocks(qs[r * per_q:(r + 1) * per_q],
                                        ss[r * per_s:(r + 1) * per_s], shard.numel())
                      for r in range(world)])


def zeropp_costs(n_params, world, per_node, dtype_bytes=2, block=256, qwz=False, hpz=False,
                 qgz=False):
    """Per rank and step of ZeRO-3, the bytes each collective sends and whether it crosses
    nodes (a collective over all `world` ranks is charged to the slower inter-node link, one
    within a node's `per_node` ranks to the fast one), and the extra memory.
    qwZ: weights all-gathered as int8 plus a float32 scale per block. hpZ: a secondary copy of
    each node's weights, sharded over its per_node ranks, so backward's all-gather stays in the
    node (costs n_params * dtype_bytes / per_node more per rank). qgZ: gradients sent as int4
    (plus scales) by an all-to-all, each rank reducing its shard in full precision."""
    if world % per_node or per_node < 1:
        raise ValueError(f"per_node={per_node} must divide world={world}")
    k, g = world, per_node
    full = n_params * dtype_bytes
    int8 = n_params * (1 + 4 / block)
    int4 = n_params * (0.5 + 4 / block)
    gathered = ring_pass_bytes(int8 if qwz else full, k)
    rows = {"forward all-gather": (gathered, "inter"),
            "backward all-gather": ((ring_pass_bytes(full, g), "intra") if hpz else
                                    (gathered, "inter")),
            "gradient reduce-scatter": (ring_pass_bytes(int4 if qgz else full, k), "inter")}
    z3 = sharding_costs(n_params, k, "zero3", "mixed_adam", dtype_bytes)
    extra = full / g if hpz else 0.0
    return dict(rows=rows, inter_bytes=sum(b for b, w in rows.values() if w == "inter"),
                intra_bytes=sum(b for b, w in rows.values() if w == "intra"),
                zero3_sent_bytes=z3["sent_bytes"], memory_bytes=z3["total_bytes"] + extra,
                extra_memory_bytes=extra)


# ---------------------------------------------------------------- the picture
def variant_memory(n_params, world, activations, dtype_bytes=2, buffer_elements=None,
                   tp_partitioned=None):
    """Device bytes per rank of mixed-precision ZeRO-3 and its variants, by part: the model's
    states (sharding_costs), checkpointed `activations`, a fused float32 reduction buffer
    (model-sized, or `buffer_elements` with ZeRO-R), and with offload the states on the host."""
    z3 = sharding_costs(n_params, world, "zero3", "mixed_adam", dtype_bytes)
    states = {"weights": z3["params_bytes"], "gradients": z3["grads_bytes"],
              "optimizer state": z3["optim_bytes"]}
    whole = n_params * 4
    const = min(n_params, buffer_elements or n_params) * 4
    part = activations if tp_partitioned is None else tp_partitioned
    return {"ZeRO-3": dict(states, activations=activations, buffer=whole),
            "+ ZeRO-R": dict(states, activations=part, buffer=const),
            "+ Offload": dict({k: 0.0 for k in states}, activations=part, buffer=const,
                              host=z3["total_bytes"])}


def variant_traffic(n_params, world, per_node, dtype_bytes=2, block=256):
    """Bytes per rank and step across nodes and within a node: ZeRO-3, then qwZ, hpZ, qgZ
    added one by one (zeropp_costs)."""
    steps = [("ZeRO-3", {}), ("+ qwZ", dict(qwz=True)), ("+ hpZ", dict(qwz=True, hpz=True)),
             ("+ qgZ", dict(qwz=True, hpz=True, qgz=True))]
    out = {}
    for label, flags in steps:
        c = zeropp_costs(n_params, world, per_node, dtype_bytes, block, **flags)
        out[label] = {"across nodes": c["inter_bytes"], "within a node": c["intra_bytes"]}
    return out


def _bars(ax, rows, title, colors, unit=1e9):
    """One stacked bar per row; a "host" part is drawn hatched after a gap, not in the total."""
    from ..schematics import SCHEMATIC_FONT as FONT
    from ..schematics import draw_box
    parts = list(dict.fromkeys(p for r in rows.values() for p in r))
    top = max(sum(r.values()) for r in rows.values()) / unit
    ax.set_title(title, fontsize=FONT, loc="left")
    ax.set(xlim=(-0.3 * top, top * 1.12), ylim=(len(rows) + 0.1, -0.15))
    for y, (label, r) in enumerate(rows.items()):
        ax.text(-0.02 * top, y + 0.4, label, ha="right", va="center", fontsize=FONT - 2)
        x = 0.0
        for p in parts:
            w = r.get(p, 0.0) / unit
            if w > 0 and p != "host":
                draw_box(ax, x, y + 0.05, w, 0.7, colors[p])
                x += w
        ax.text(x + 0.01 * top, y + 0.4, f"{x:.1f}", va="center", fontsize=FONT - 3)
        if r.get("host"):
            at, w = x + 0.12 * top, r["host"] / unit
            draw_box(ax, at, y + 0.05, w, 0.7, "white", edge="black", hatch="//")
            ax.text(at + w + 0.01 * top, y + 0.4, f"{w:.1f} on the host", va="center",
                    fontsize=FONT - 3)
    return [p for p in parts if p != "host"]


PALETTE = {"weights": "#0072B2", "gradients": "#E69F00", "optimizer state": "#009E73",
           "activations": "#CC79A7", "buffer": "#56B4E9", "across nodes": "#D55E00",
           "within a node": "#0072B2"}


def plot_variants(memory, traffic):
    """Two panels: device memory per rank by part (variant_memory) and bytes per rank and step
    across and within nodes (variant_traffic), in GB, one bar per variant."""
    from matplotlib.patches import Patch

    from ..schematics import SCHEMATIC_FONT as FONT
    from ..schematics import diagram
    fig, axes = diagram(2, 1, width=7.2, height=7.0)
    for ax, rows, title in [(axes[0, 0], memory, "device memory per rank (GB)"),
                            (axes[1, 0], traffic, "sent per rank and step (GB)")]:
        parts = _bars(ax, rows, title, PALETTE)
        ax.legend(handles=[Patch(facecolor=PALETTE[p], label=p) for p in parts],
                  loc="upper center", bbox_to_anchor=(0.5, 0.02), fontsize=FONT - 4,
                  frameon=False, ncol=3)
    fig.tight_layout()
    return fig
