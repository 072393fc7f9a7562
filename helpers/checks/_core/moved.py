"""What crossed between devices in a Recorder's record: every copy from one device to another
with the elements it carried (`moves`), which inputs' data each one carried (`carried`), and
per device what it received of some tensors' data (`received`), so a split check can bound
each device to its slice of what was split."""
import collections

from .flow import PYTHON, follow
from .observe import describe_device
from .run import expect

__all__ = ["moves", "carried", "received", "PYTHON", "expect_slices_received"]


def moves(rec, ops=None):
    """(source device, destination device, elements, storage key read) of every copy between
    devices (`.to`, `copy_`), in order."""
    out = []
    for op in rec.transfers(ops):
        src = op.reads[-1 if op.name == "copy_" else 0]
        out.append((src.device, (op.writes or op.outputs)[0].device, src.numel, src.key))
    return out


def carried(rec, tensors):
    """(source device, destination device, elements, {name: elements of it carried}, made from
    the inputs, the names of the buffer it was read from) of every copy between devices, in
    order, for `tensors` ({name: tensor}): what each move carries, per range of the storage it
    read (a range of a concatenation carries its own operands' elements; the whole storage's
    names tell a chunk of a flat buffer from a tensor sent alone), and a move of a layer's
    partial sums (a product, flow.py) carries no name."""
    return [(src.device, (op.writes or op.outputs)[0].device, src.numel,
             {n: min(v, src.numel) for n, v in names.items()}, made, buffer)
            for op, src, names, made, buffer in follow(rec, tensors)]


def received(rec, tensors):
    """{name: {device: elements of that tensor's data the device received by copies between
    devices}} for `tensors` ({name: tensor}), and under PYTHON what reached a device of data no
    recorded operation made and no input held (`torch.tensor(..., device=)`, a tensor made
    before the call). The record is followed in order (flow.py), so a move of several names
    (a packed buffer) charges each the elements it brought, and a whole tensor sent after
    arithmetic on it is still charged whole."""
    got = {name: collections.Counter() for name in [*tensors, PYTHON]}
    for _, dst, _, names, _, _ in carried(rec, tensors):
        for name, n in names.items():
            got[name][dst] += n
    return got


def expect_slices_received(call, rec, devices, split, replicated=(), spare=8):
    """Each device (the host too) received at most its slice of every split tensor (`split`:
    {name: (tensor, dim)}; a slice counts up to 1.6 times an even share, at least the largest of
    tensor_split's, as the work bounds allow) and one copy of every replicated one
    (`replicated`: {name: tensor}); of other data, `spare` elements (scalars)."""
    k, replicated = len(devices), dict(replicated)
    tensors = {**{n: t for n, (t, _) in split.items()}, **replicated}
    slices, bounds = {}, {n: t.numel() for n, t in replicated.items()}
    for n, (t, dim) in split.items():
        size = t.shape[dim]
        rest = t.numel() // max(size, 1)
        slices[n] = -(-size // k) * rest                   # tensor_split's largest slice
        bounds[n] = max(1.6 * size / k * rest, slices[n])
    bounds[PYTHON] = spare
    for name, per_device in received(rec, tensors).items():
        for d, n in sorted(per_device.items(), key=lambda x: (-x[1], str(x[0]))):
            if name in slices:
                how = (f"its slice is about {slices[name]}: move only each device's slice to it "
                       "(slice first, then .to(devices[i]))")
            elif name in replicated:
                how = f"{replicated[name].numel()} in all: move it to a device once"
            else:
                how = "make each device's slice from the inputs, then move it there"
            expect(n <= bounds[name], f"{call}: {describe_device(d)} received {n:.0f} elements "
                                      f"of {name}; {how}")
