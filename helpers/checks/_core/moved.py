"""What crossed between devices in a Recorder's record: every copy from one device to another
with the elements it carried (`moves`), which inputs' data each one carried (`carried`), and
per device what it received of some tensors' data (`received`), so a split check can bound
each device to its slice of what was split."""
import collections

from .observe import _MATMULS, _OVERWRITES, describe_device, storage_key
from .run import expect
from .spans import WHOLE, span

__all__ = ["moves", "carried", "received", "PYTHON", "expect_slices_received"]


def moves(rec, ops=None):
    """(source device, destination device, elements, storage key read) of every copy between
    devices (`.to`, `copy_`), in order."""
    out = []
    for op in rec.transfers(ops):
        src = op.reads[-1 if op.name == "copy_" else 0]
        out.append((src.device, (op.writes or op.outputs)[0].device, src.numel, src.key))
    return out


PYTHON = "data made from Python numbers or tensors other than the inputs"


def _holds(held, r):
    """{name: elements} read `r` takes of its storage: each range it overlaps gives each of its
    names at most the overlap's elements, and the read at most its own elements."""
    total, (a, b, _), size = collections.Counter(), r.span, r.dtype.itemsize
    for (lo, hi), names in held.get(r.key, {}).items():
        over = min(hi, b) - max(lo, a)
        if over > 0:
            over = -(-over // size)
            for name, n in names.items():
                total[name] += min(n, over)
    return {name: min(n, r.numel) for name, n in total.items()}


def _passed_on(op, data, held, but=None):
    """{name: elements} an operation's result holds of each name: what its reads hold (`_holds`:
    a view, the ranges of its storage it covers); a product of two or more
    operands made from the inputs (a matmul, a convolution: the layer's own partial results,
    which right answers move) holds none, while one of a single such operand with constants
    (`W @ eye`) holds that operand's, like elementwise operations (`W * 1`, `-W`, `flip`,
    reductions) and copies (moves, views, concatenations, selections). `but`: a view written
    in place, whose own read is left out (what it held stays, or is overwritten)."""
    reads = [r for i, r in enumerate(op.reads) if i not in op.blind]
    if op.is_work and (op.name in _MATMULS or op.flops is not None) and sum(
            r.key in data for r in reads) > 1:
        return {}
    total, skip = collections.Counter(), but is not None
    for r in reads:
        if skip and r.key == but.key and r.span == but.span:
            skip = False        # the written view itself (once: `x.copy_(x)` reads it again)
        else:
            total.update(_holds(held, r))
    return total


def _drop(ranges, a, b):
    """`ranges` ({(first byte, end): names}) without the bytes a..b (overwritten): a range
    reaching past them keeps its names on what is left (each read caps them by its overlap)."""
    out = {}
    for (lo, hi), names in ranges.items():
        for part in ([(lo, hi)] if hi <= a or lo >= b else [(lo, a), (b, hi)]):
            if part[0] < part[1]:
                out[part] = out.get(part, collections.Counter()) | names
    return out


def _write(op, w, reads, data, held):
    """Names written into view `w`: an overwrite of a dense range (`copy_`, `fill_`, an `out=`
    of the whole) drops what the range held; then what the other reads hold joins the range."""
    ranges, (a, b, dense) = held[w.key], w.span
    names = _passed_on(op, data, held, but=w)
    if dense and a < b and (op.name in _OVERWRITES or not any(r.key == w.key for r in reads)):
        ranges = held[w.key] = _drop(ranges, a, b)
    if names:
        had = ranges.setdefault((a, b), collections.Counter())
        for n, v in names.items():
            had[n] = max(had[n], min(had[n] + v, w.numel))


def _follow(rec, tensors):
    """Every copy between devices in order, as (op, the storage it read, {name: elements} that
    read holds, whether it was made from the inputs): each storage holding, per range of its
    bytes, the elements of each name's data it carries (`_passed_on`: through copies and
    elementwise arithmetic alike; `_write`: a write into a view changes its range only), and
    under PYTHON data no recorded operation made and no input held."""
    held = collections.defaultdict(dict)    # storage key -> {(first byte, end): {name: elements}}
    for name, t in tensors.items():
        lo, hi, _ = span(t)
        held[storage_key(t)].setdefault((lo, hi), collections.Counter())[name] += t.numel()
    data = set(held)            # storages made from the inputs (products of them included)
    for op in rec.ops:
        for r in op.reads:
            if r.version == 0 and r.key not in data:
                whole = held[r.key].setdefault(WHOLE, collections.Counter())
                whole[PYTHON] = max(whole[PYTHON], r.numel)
    for op in rec.ops:
        if op.is_transfer:
            src = op.reads[-1 if op.name == "copy_" else 0]
            yield op, src, _holds(held, src), src.key in data
        passed = _passed_on(op, data, held)
        reads = [r for i, r in enumerate(op.reads) if i not in op.blind]
        if any(r.key in data for r in reads):
            data.update(r.key for r in op.outputs + op.writes)
        for r in op.outputs:
            held[r.key] = {WHOLE: collections.Counter(
                {n: min(v, r.numel) for n, v in passed.items()})}
        for w in op.writes:
            _write(op, w, reads, data, held)


def carried(rec, tensors):
    """(source device, destination device, elements, {name: elements of it carried}, made from
    the inputs) of every copy between devices, in order, for `tensors` ({name: tensor}): what
    each move carries, whatever its size (a chunk of a buffer carries the buffer's names), and
    a move made from the inputs by products (`_passed_on`) carries no name."""
    return [(src.device, (op.writes or op.outputs)[0].device, src.numel,
             {n: min(v, src.numel) for n, v in names.items()}, made)
            for op, src, names, made in _follow(rec, tensors)]


def received(rec, tensors):
    """{name: {device: elements of that tensor's data the device received by copies between
    devices}} for `tensors` ({name: tensor}), and under PYTHON what reached a device of data no
    recorded operation made and no input held (`torch.tensor(..., device=)`, a tensor made
    before the call). The record is followed in order (`_follow`), so a move of several names
    (a packed buffer) charges each the elements it brought, and a whole tensor sent after
    arithmetic on it is still charged whole."""
    got = {name: collections.Counter() for name in [*tensors, PYTHON]}
    for _, dst, _, names, _ in carried(rec, tensors):
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
