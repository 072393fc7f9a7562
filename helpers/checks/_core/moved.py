"""What crossed between devices in a Recorder's record: every copy from one device to another
with the elements it carried (`moves`), and per device what it received of some tensors' data
(`received`), so a split check can bound each device to its slice of what was split."""
import collections

from .observe import describe_device, storage_key
from .run import expect

__all__ = ["moves", "received", "PYTHON", "expect_slices_received"]

# selections that copy some of their input's elements unchanged (Recorder counts them as work)
_SELECTIONS = frozenset({"index", "take", "masked_select", "narrow_copy", "repeat",
                         "repeat_interleave", "unfold_copy", "slice_copy", "select_copy"})


def moves(rec, ops=None):
    """(source device, destination device, elements, storage key read) of every copy between
    devices (`.to`, `copy_`), in order."""
    out = []
    for op in rec.transfers(ops):
        src = op.reads[-1 if op.name == "copy_" else 0]
        out.append((src.device, (op.writes or op.outputs)[0].device, src.numel, src.key))
    return out


def _carriers(rec, keys):
    """The storages `keys` and those holding copies or selections of their data made without
    arithmetic (moves, views, clones, concatenations, indexing)."""
    keys = set(keys)
    for op in rec.ops:
        if (not op.is_work or op.name in _SELECTIONS) and any(
                r.key in keys for i, r in enumerate(op.reads) if i not in op.blind):
            keys |= {r.key for r in op.outputs + op.writes}
    return keys


PYTHON = "data made from Python numbers or tensors other than the inputs"


def received(rec, tensors):
    """{name: {device: elements of that tensor's data the device received by copies between
    devices}} for `tensors` ({name: tensor}), and under PYTHON what reached a device of data no
    recorded operation made and no input held (`torch.tensor(..., device=)`, a tensor made
    before the call); a copy of several at once (a concatenation moved whole) counts an equal
    part to each."""
    carriers = {name: _carriers(rec, [storage_key(t)]) for name, t in tensors.items()}
    inputs = set().union(*carriers.values())
    outside = {r.key for op in rec.ops for r in op.reads if r.version == 0} - inputs
    carriers[PYTHON] = _carriers(rec, outside)
    got = {name: collections.Counter() for name in carriers}
    for _, dst, n, key in moves(rec):
        names = [name for name, keys in carriers.items() if key in keys]
        for name in names:
            got[name][dst] += n / len(names)
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
