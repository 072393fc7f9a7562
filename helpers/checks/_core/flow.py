"""How moved.py follows each input's elements ("names") through a Recorder's record: each storage
holds, per range of its bytes, the elements of each name it carries (spans.py: storage offset,
sizes and strides, no data read). Copies, views, selections, elementwise arithmetic and
reductions pass names on; a concatenation places each operand's at its own place; a product
passes none only where it sums terms of two operands that each carry at least a term's worth of
the inputs' data (a layer's partial sums, which right answers move): it holds MIXED instead."""
import collections
import itertools
import math

from .observe import _MATMULS, storage_key
from .spans import RUNS, WHOLE, Runs, span
from .values import Values

__all__ = ["follow", "PYTHON", "MIXED"]

PYTHON = "data made from Python numbers or tensors other than the inputs"
MIXED = "partial sums of the inputs"     # a product's, no input's own elements
_ADDED = frozenset({"addmm", "addmv", "baddbmm", "addbmm"})   # bias first, then the product's
_LAST = frozenset({"mm", "bmm", "mv", "dot", "vdot", "linear", "matmul"}) | _ADDED  # sums a's last
_CONVS = frozenset({"convolution", "_convolution", "cudnn_convolution", "_slow_conv2d_forward",
                    "convolution_overrideable"})


def _terms(op):
    """(positions among the reads of the operands multiplied, terms each element of the result
    sums): a product of one term (an outer product, a 1x1 convolution of one channel) is
    elementwise arithmetic; an operation whose form is not known here sums 2."""
    r = op.reads
    pos = (1, 2) if op.name in _ADDED else (0, 1)
    if len(r) <= pos[1]:
        return tuple(range(len(r))), 2
    a, b = r[pos[0]].shape, r[pos[1]].shape
    if op.name in _CONVS:
        return pos, math.prod(b[1:])
    if op.name == "addbmm" and len(a) == 3:
        return pos, a[0] * a[-1]
    if op.name in _LAST and a:
        return pos, a[-1]
    if op.name.startswith(("_scaled_dot_product", "_flash_attention", "_efficient_attention")):
        return (0, 1, 2), min(a[-1], b[-2]) if len(b) > 1 and a else 2
    return tuple(range(len(r))), 2


class _Flow:
    """The names each storage holds (`held`), the storages made from the inputs (`data`), and
    which reads hold the same values (`values`)."""

    def __init__(self):
        self.held = collections.defaultdict(dict)   # key -> {(first byte, end): {name: elements}}
        self.data, self.values, self._runs = set(), Values(), {}
        self.reached = collections.defaultdict(set)     # key -> names whose data reached it

    def runs(self, r):
        if id(r) not in self._runs:
            offset, strides = r.layout or (None, None)
            self._runs[id(r)] = (r, Runs(offset, r.shape, strides, r.dtype.itemsize, r.span))
        return self._runs[id(r)][1]

    def holds(self, r, runs=None, numel=None):
        """{name: elements} read `r` takes of its storage (or the part of it `runs` covers, of
        `numel` elements): each range it overlaps gives each of its names at most the
        overlap's elements, and the read at most its own elements."""
        runs = self.runs(r) if runs is None else runs
        numel = r.numel if numel is None else numel
        total, size = collections.Counter(), r.dtype.itemsize
        for (lo, hi), names in self.held.get(r.key, {}).items():
            over = runs.within(lo, hi)
            if over > 0:
                over = numel if math.isinf(over) else -(-over // size)
                for name, n in names.items():
                    total[name] += min(n, over)
        return {name: min(n, numel) for name, n in total.items()}

    def carries(self, r):
        """Of how many elements of the inputs' data (products' included) read `r` is made, at
        most: its distinct elements (a broadcast one counts once)."""
        distinct = r.numel if r.layout is None else math.prod(
            n for n, s in zip(r.shape, r.layout[1], strict=True) if s != 0)
        return min(distinct, sum(n for name, n in self.holds(r).items() if name != PYTHON))

    def mixes(self, op):
        """A product of two operands or more that each carry the inputs' data, at least as many
        elements as the terms it sums: a constant made from the inputs (`x / x`, a reduction to
        one number times ones) or an outer product re-encodes its other operand instead."""
        if not (op.is_work and (op.name in _MATMULS or op.flops is not None)):
            return False
        pos, terms = _terms(op)
        return terms > 1 and sum(
            i not in op.blind and op.reads[i].key in self.data
            and self.carries(op.reads[i]) >= terms for i in pos) > 1

    def passed_on(self, op, but=None):
        """{name: elements} an operation's result holds of each name: what its reads hold (not
        a view it overwrites unread, an out=); a product that `mixes` holds MIXED only. `but`:
        a view written in place, whose own read is left out (what it held stays)."""
        if self.mixes(op):
            return {MIXED: math.inf}
        total, skip = collections.Counter(), but is not None
        for i, r in enumerate(op.reads):
            if i in op.blind or i in op.targets:
                continue
            if skip and r.key == but.key and r.span == but.span:
                skip = False        # the written view itself (once: `x.copy_(x)` reads it again)
            else:
                total.update(self.holds(r))
        return total

    def write(self, op, w, reads, constant, fresh):
        """Names written into view `w`: an overwrite of a dense range (`fresh`: `copy_`,
        `fill_`, an `out=` of any extent; a constant made in place) drops what the range held;
        then what the reads hold joins the range (an in-place op's own view's once)."""
        ranges, (a, b, dense) = self.held[w.key], w.span
        names = {} if constant else self.passed_on(op, but=None if fresh else w)
        if dense and a < b and (fresh or constant or not any(r.key == w.key for r in reads)):
            ranges = self.held[w.key] = _drop(ranges, a, b)
        if names:
            had = ranges.setdefault((a, b), collections.Counter())
            for n, v in names.items():
                had[n] = max(had[n], min(had[n] + v, w.numel))

    def placed(self, op, out):
        """{(first byte, end): names} of a cat's or stack's result, each operand's names at its
        own place (along dim 0 one range each, along a later dim one per index before it), or
        None where that is not known (its names then span the whole result)."""
        shape, size = out.shape, out.dtype.itemsize
        parts = [(i, r) for i, r in enumerate(op.reads) if r.numel]
        if not out.span[2] or any(r.layout is None for _, r in parts):
            return None
        if op.name == "stack":
            ints = [v for v in (op.consts or ((), ()))[0] if type(v) is int]
            dim = ints[0] % len(shape) if ints else 0
            views = [(i, r, r.shape[:dim] + (1,) + r.shape[dim:],
                      r.layout[1][:dim] + (0,) + r.layout[1][dim:]) for i, r in parts]
        else:
            parts = [(i, r) for i, r in parts if len(r.shape) == len(shape)]
            dim = next((d for d in range(len(shape))
                        if any(r.shape[d] != shape[d] for _, r in parts)), 0)
            views = [(i, r, r.shape, r.layout[1]) for i, r in parts]
        if not shape or math.prod(shape[:dim]) * len(views) > RUNS:
            return None
        inner, ranges, at = math.prod(shape[dim + 1:]), {}, 0
        for i, r, sizes, strides in views:
            width = sizes[dim] * inner
            for o, index in enumerate(itertools.product(*map(range, sizes[:dim]))):
                first = r.layout[0] + sum(j * s for j, s in zip(index, strides, strict=False))
                runs = Runs(first, sizes[dim:], strides[dim:], r.dtype.itemsize, r.span)
                names = {} if i in op.blind else self.holds(r, runs, width)
                lo = out.span[0] + (o * shape[dim] * inner + at) * size
                if names:
                    ranges[(lo, lo + width * size)] = collections.Counter(names)
            at += width
        return ranges


def _drop(ranges, a, b):
    """`ranges` ({(first byte, end): names}) without the bytes a..b (overwritten): a range
    reaching past them keeps its names on what is left (each read caps them by its overlap)."""
    out = {}
    for (lo, hi), names in ranges.items():
        for part in ([(lo, hi)] if hi <= a or lo >= b else [(lo, a), (b, hi)]):
            if part[0] < part[1]:
                out[part] = out.get(part, collections.Counter()) | names
    return out


def follow(rec, tensors):
    """Every copy between devices in order, as (op, the storage it read, {name: elements} that
    read holds, whether it was made from the inputs, the names whose data reached its storage
    through any operation: what a buffer it is a chunk of was made of). Each storage holds, per
    range of its bytes, the elements of each name's data it carries (through copies and
    elementwise arithmetic alike; a write into a view changes its range only), and under PYTHON
    data no recorded operation made and no input held. MIXED, a product's, names no move."""
    f = _Flow()
    for name, t in tensors.items():
        lo, hi, _ = span(t)
        f.held[storage_key(t)].setdefault((lo, hi), collections.Counter())[name] += t.numel()
        f.reached[storage_key(t)].add(name)
    f.data = set(f.held)        # storages made from the inputs (products of them included)
    for op in rec.ops:
        for r in op.reads:
            if r.version == 0 and r.key not in f.data:
                whole = f.held[r.key].setdefault(WHOLE, collections.Counter())
                whole[PYTHON] = max(whole[PYTHON], r.numel)
    for op in rec.ops:
        if op.is_transfer:
            src = op.reads[-1 if op.name == "copy_" else 0]
            names = {n: v for n, v in f.holds(src).items() if n != MIXED}
            yield op, src, names, src.key in f.data, set(f.reached[src.key])
        constant = f.values.record(op)      # `x / x`: what it reads does not reach its result
        passed = {} if constant else f.passed_on(op)
        reads = [r for i, r in enumerate(op.reads) if i not in op.blind and i not in op.targets]
        if not constant and any(r.key in f.data for r in reads):
            f.data.update(r.key for r in op.outputs + op.writes)
        came = set().union(*(f.reached[r.key] for r in reads)) if not constant else set()
        for w in op.writes:
            f.reached[w.key] |= came
        for r in op.outputs:
            f.reached[r.key] = set(came)
            placed = f.placed(op, r) if op.name in ("cat", "stack") and not constant else None
            f.held[r.key] = placed if placed is not None else {WHOLE: collections.Counter(
                {n: min(v, r.numel) for n, v in passed.items()})}
        for j, w in enumerate(op.writes):
            f.write(op, w, reads, constant, j in op.fresh)
