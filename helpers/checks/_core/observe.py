"""What an answer computed, seen from below: every aten operation it ran, on which device, on
which storages, and what flowed into what.

`Recorder` is a TorchDispatchMode (one per thread: modes are thread-local; the threads an answer
starts share its, noting one operation at a time). For each operation it keeps an `Op`: name,
device, the tensors read and written (storage, version, shape, dtype). From that a check can ask
- `work_by_device()`, `adds_by_device()`: how many elements each device computed, added up;
- `transfers()`: every copy between devices (`.to`, `copy_`), with the storage it read;
- `ancestors(t)`: the operations whose results flowed into tensor `t` (a dataflow walk over
  storage versions, so in-place additions into views count);
- `depends_on(tensors, refs)`: whether any of the storage versions `refs` flowed into `tensors`
  (the same walk, where an operation that overwrites the whole of a storage, `copy_`, `fill_`,
  `zero_`, an `out=`, does not depend on what the storage held before, nor one that cancels an
  operand, `x * 0`, `x - x`, nor one whose values leave the result bitwise the same:
  cancels.py);
- `reached_by(refs)`: the storages the data of some storage versions reached through any
  operation, and `live_peak(keys)`: the most bytes of them alive at once;
- `first_error_op`: the operation that raised (for "this mixed cuda:0 and cuda:1").
Storages are told apart by their StorageImpl (real, meta and fake tensors alike); the recorder
keeps every storage it saw alive, so no address is reused while it records.
"""
import collections
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry as _FLOPS

from .cancels import cancelled, snapshot, unused
from .composite import split_composite
from .guard import TORCH_OPERATORS, own_operator
from .host_pin import HostPins
from .placeholders import placeholder
from .run import observer_failed
from .spans import layout, span, storage_key
from .values import adds_zero, consts, makes_zeros
from .written import Written

__all__ = ["Recorder", "Op", "Ref", "storage_key", "describe_device"]

aten = torch.ops.aten

# additions: elements added per call (anything else counts as work, not as additions)
_ELEMENTWISE_ADDS = frozenset({"add", "add_", "sub", "sub_", "addcmul", "addcmul_", "addcdiv",
                               "addcdiv_", "rsub", "lerp", "lerp_", "_foreach_add",
                               "_foreach_add_"})
_REDUCING_ADDS = frozenset({"sum", "mean", "nansum", "cumsum", "cumsum_", "logsumexp", "norm",
                  "linalg_vector_norm", "var", "std", "var_mean", "std_mean", "prod", "trace",
                  "cumprod", "cumprod_", "logcumsumexp", "_logcumsumexp", "col2im"})
_SCATTER_ADDS = frozenset({"index_add", "index_add_", "scatter_add", "scatter_add_", "index_put",
                 "index_put_", "_index_put_impl_", "scatter_reduce", "scatter_reduce_",
                 "embedding_dense_backward", "bincount"})
_MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "dot", "vdot", "mv", "addmv",
                      "addbmm", "convolution", "convolution_backward", "_convolution", "linear",
                      "einsum", "_scaled_dot_product_flash_attention",
                      "_scaled_dot_product_efficient_attention"})
# no computation: moves, views, metadata, fresh tensors, gathers (im2col: F.unfold's patches)
_NOT_WORK = {"_to_copy", "copy_", "clone", "_copy_from", "to", "lift_fresh", "lift_fresh_copy",
             "detach", "detach_", "alias", "empty", "empty_like", "empty_strided", "zeros",
             "zeros_like", "ones", "ones_like", "full", "full_like", "new_empty", "new_zeros",
             "new_ones", "new_full", "new_empty_strided", "scalar_tensor", "arange", "randn",
             "rand", "randint", "normal_", "uniform_", "zero_", "fill_", "set_", "cat", "stack",
             "split", "split_with_sizes", "unbind", "_local_scalar_dense", "equal", "is_pinned",
             "_has_compatible_shallow_copy_type", "resize_", "contiguous", "_unsafe_view",
             "unsqueeze_", "squeeze_", "t_", "transpose_", "as_strided_", "constant_pad_nd",
             "index_select", "gather", "masked_fill_", "masked_fill", "where", "expand_copy",
             "slice_scatter", "select_scatter", "permute_copy", "_foreach_copy_", "im2col"}
_NOT_WORK = frozenset(_NOT_WORK)


def describe_device(device):
    d = torch.device(device)
    return "the CPU" if d.type == "cpu" else str(d)


class Ref:
    """A tensor as one operation saw it."""

    __slots__ = ("key", "version", "shape", "dtype", "device", "numel", "span", "layout")

    def __init__(self, t, version):
        self.key, self.version = storage_key(t), version
        self.shape, self.dtype, self.device = tuple(t.shape), t.dtype, t.device
        self.numel, self.span = t.numel(), span(t)     # span: (first byte, end, dense)
        self.layout = layout(t)                         # (storage offset, strides)

    @property
    def nbytes(self):
        return self.numel * self.dtype.itemsize

    def __repr__(self):
        return f"{list(self.shape)} on {describe_device(self.device)}"


class Op:
    """One aten operation: what it read, what it wrote, where."""

    __slots__ = ("index", "name", "func", "reads", "writes", "outputs", "device", "flops",
                 "view", "thread", "blind", "targets", "fresh", "scalar", "consts", "zeros")

    def __init__(self, index, func):
        self.index, self.func = index, func
        self.name = func.__name__.split(".")[0]
        self.reads, self.writes, self.outputs = [], [], []
        self.device, self.flops, self.view = None, None, False
        self.blind = ()          # positions in reads of storages overwritten whole, not read
        self.targets = ()        # positions in reads of views it overwrites unread (an out=)
        self.fresh = ()          # positions in writes of those views (written.py)
        self.scalar = False      # a Python float among its operands (`g *= max_norm / norm`)
        self.consts = None       # its operands that are not tensors (values.py), if hashable
        self.zeros = ()          # positions in reads of tensors of zeros (values.makes_zeros)

    @property
    def is_transfer(self):
        """A copy from one device to another."""
        if self.name not in ("_to_copy", "copy_", "_copy_from") or not self.reads:
            return False
        dst = (self.writes or self.outputs)
        return bool(dst) and self.src_device != dst[0].device

    @property
    def src_device(self):
        return self.reads[-1 if self.name == "copy_" else 0].device

    @property
    def is_work(self):
        return (not self.view and self.name not in _NOT_WORK and bool(self.reads)
                and not self.plus_zero)

    @property
    def work(self):
        """Elements computed: multiply-adds for products, else the larger of elements read and
        written."""
        if not self.is_work:
            return 0
        if self.flops is not None:
            return self.flops // 2
        read = sum(r.numel for i, r in enumerate(self.reads) if i not in self.targets)
        written = sum(r.numel for r in self.writes + self.outputs)
        return max(read, written)

    @property
    def adds(self):
        """Elements added (additions of products, sums, in-place accumulations)."""
        if not self.is_work:
            return 0
        out = sum(r.numel for r in (self.writes or self.outputs))
        if self.name in _ELEMENTWISE_ADDS:
            return out
        if self.name in _REDUCING_ADDS:
            return max(sum(r.numel for r in self.reads[:1]) - out, out if "cum" in self.name
                       else 0)
        if self.name in _SCATTER_ADDS:
            return max((r.numel for r in self.reads[1:]), default=out)
        if self.flops is not None:
            return self.flops // 2
        return 0

    @property
    def plus_zero(self):
        """`t + 0`, `0 + t`, `t - 0`, `zeros_like(t) + g`: a copy, neither work nor an addition
        (Python's sum() starts from 0: `sum(chunks)` makes k additions, k - 1 real), one rule
        for every check that counts (values.adds_zero)."""
        return adds_zero(self)

    def __repr__(self):
        args = ", ".join(map(repr, self.reads))
        return f"{self.name}({args}) on {describe_device(self.device) if self.device else '-'}"


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class Recorder(TorchDispatchMode):
    """Records every aten operation run while it is active (see the module's docstring).
    `answer_scalars=True` answers data-dependent calls (`.item()`, `torch.equal`) with a
    placeholder instead of raising (placeholders.py): on fake devices values are unknown,
    placement is not."""

    def __init__(self, answer_scalars=False):
        super().__init__()
        self.ops, self.answer_scalars = [], answer_scalars
        self.answered, self.replay = 0, []      # placeholders answered; CPU values to replay
        self.version = collections.Counter()     # storage key -> writes so far
        self.producer = {}                       # (key, version) -> op index
        self.failed = None                       # (func, reads) of the operation that raised
        self.from_python = {}    # storage key -> first op that took it in from Python/numpy data
        self._keep, self._lock = [], threading.RLock()     # threads note one op at a time
        self._pins = HostPins()         # pin_memory without CUDA: a host copy (host_pin.py)
        self.zeros = set()       # (storage key, version) of tensors of zeros made (values.py)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        parts = split_composite(self, func, args, kwargs)
        if parts is not NotImplemented:      # inference mode: its parts were recorded
            return parts
        name = func.__name__.split(".")[0]
        space = getattr(func, "namespace", "aten")
        if space not in TORCH_OPERATORS:
            own_operator(getattr(getattr(func, "_schema", None), "name", f"{space}::{name}"))
        with self._lock:
            value = placeholder(self, name, args) if self.answer_scalars else NotImplemented
        if value is not NotImplemented:
            return value
        inputs = _tensors((args, kwargs))
        written = snapshot(func, args, kwargs)
        try:
            out = self._pins.call(func, args, kwargs)
        except Exception:
            if self.failed is None:
                self.failed = (name, [Ref(t, self.version[storage_key(t)]) for t in inputs])
            raise
        if space in TORCH_OPERATORS and name in (
                "device", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "dim",
                "is_same_size", "_has_compatible_shallow_copy_type"):
            return out
        with self._lock:
            try:
                self._record(func, args, kwargs, inputs, out,
                             unused(func, args, kwargs, out, written))
            except Exception as e:       # the record's own failure: never the answer's
                raise observer_failed(f"the check's record of aten::{name}", e) from e
        return out

    def _record(self, func, args, kwargs, inputs, out, unread=()):
        op = Op(len(self.ops), func)
        schema = func._schema
        written = Written(func, args, kwargs, inputs)
        blind = {*cancelled(op.name, args, kwargs), *unread}  # x * 0, x - x, lerp(y, x, 0)
        op.view = any(r.alias_info is not None and not r.alias_info.is_write
                      for r in schema.returns)
        lift = op.name in ("lift_fresh", "lift_fresh_copy")
        for t in inputs:
            op.reads.append(Ref(t, self.version[storage_key(t)]))
            if (lift or op.reads[-1].version == 0) and op.reads[-1].key not in self.from_python:
                if lift or not t.untyped_storage().resizable():
                    self.from_python[op.reads[-1].key] = op.index
        op.blind = tuple(sorted({i for i, t in enumerate(inputs) if id(t) in blind}
                                | written.blind))
        op.targets = tuple(sorted(written.targets))
        op.scalar = any(isinstance(a, float) for a in (*args, *kwargs.values()))
        op.consts = consts(args, kwargs)
        op.zeros = tuple(i for i, r in enumerate(op.reads) if (r.key, r.version) in self.zeros)
        outs = _tensors(out)
        for t in written.tensors:           # each once, however often it is handed over
            key = storage_key(t)
            self.version[key] += 1
            op.writes.append(Ref(t, self.version[key]))
            self.producer[(key, self.version[key])] = op.index
        op.fresh = tuple(i for i, t in enumerate(written.tensors) if id(t) in written.fresh)
        if not op.view:
            mine = {id(t) for t in written.tensors}
            for t in outs:
                if id(t) in mine:
                    continue
                key = storage_key(t)
                self.version[key] += 1
                op.outputs.append(Ref(t, self.version[key]))
                self.producer[(key, self.version[key])] = op.index
                self._keep.append(t)
        if makes_zeros(op):     # made, or written in place (`zero_`, `mul_(0)`)
            self.zeros.update((r.key, r.version) for r in op.outputs + op.writes)
        self._keep.extend(inputs)
        devices = [r.device for r in op.writes + op.outputs] or [r.device for r in op.reads]
        op.device = devices[0] if devices else None
        packet = getattr(func, "_overloadpacket", None)
        if op.name in _MATMULS or packet in _flop_registry():
            try:
                op.flops = int(_flop_registry()[packet](*args, **kwargs, out_val=out))
            except Exception:    # no formula for this overload: count elements
                op.flops = None
        self.ops.append(op)

    # --- questions a check asks --------------------------------------------------------------
    def work_by_device(self, ops=None):
        """{device: elements computed there}."""
        return self._sum(ops, "work")

    def adds_by_device(self, ops=None):
        """{device: elements added there}."""
        return self._sum(ops, "adds")

    def working_devices(self, devices, ops=None):
        """`devices`, then every other device that added or computed anything (the host, the CPU,
        included): a bound per device that loops over the devices it expects leaves out the one
        an answer moved the work to."""
        busy = {*self.adds_by_device(ops), *self.work_by_device(ops)}
        return list(devices) + sorted(busy - set(devices), key=str)

    def copies_of(self, keys):
        """`keys` (storage keys) and those of every storage their data reached without
        computation (copies, moves, concatenations, stacks: not `is_work`)."""
        keys = set(keys)
        for op in self.ops:
            if not op.is_work and any(r.key in keys for r in op.reads):
                keys |= {r.key for r in op.outputs + op.writes}
        return keys

    def reached_by(self, refs):
        """(keys, refs): the storages, and their (storage key, version)s, whose dataflow reaches
        one of the (storage key, version) `refs`: what any operation, work included, made or
        wrote from them, and so on (a block kept as `kv * 1.0`, `-kv` or `kv.double()` is still
        the block's data); an operand an operation overwrites whole or cancels does not pass on."""
        tainted = set(refs)
        for op in self.ops:
            if any((r.key, r.version) in tainted for i, r in enumerate(op.reads)
                   if i not in op.blind):
                tainted.update((r.key, r.version) for r in op.outputs + op.writes)
        return {key for key, _ in tainted}, tainted

    def live_peak(self, keys=None, kept=(), until=None):
        """The most bytes alive at once in the storages the recorded operations made (of those
        in `keys`, if given): a storage lives from the operation that first made or wrote it to
        the last that read or wrote it (what the answer still needed, not what Python holds),
        or to `until[key]` (an op index) if later: a send's buffer, held until its wait;
        `kept`: (operation index, bytes) held from there to the end (values read out of torch,
        which nothing follows)."""
        span = {("kept", i): [at, len(self.ops), n] for i, (at, n) in enumerate(kept)}
        for op in self.ops:
            for r in op.outputs + op.writes:
                if keys is None or r.key in keys:
                    s = span.setdefault(r.key, [op.index, op.index, 0])
                    s[1], s[2] = op.index, max(s[2], r.nbytes)
            for r in op.reads:
                if r.key in span:
                    span[r.key][1] = op.index
        for key, end in (until or {}).items():
            if key in span:
                span[key][1] = max(span[key][1], end)
        events = sorted([(a, n) for a, _, n in span.values()] +
                        [(b + 0.5, -n) for _, b, n in span.values()])
        peak = now = 0
        for _, n in events:
            now += n
            peak = max(peak, now)
        return peak

    def _sum(self, ops, what):
        total = collections.Counter()
        for op in self.ops if ops is None else ops:
            value = getattr(op, what)
            if value:
                total[op.device] += value
        return dict(total)

    def transfers(self, ops=None):
        """The copies between devices, in order."""
        return [op for op in (self.ops if ops is None else ops) if op.is_transfer]

    def named(self, *names):
        return [op for op in self.ops if op.name in names]

    def latest(self, t):
        """(storage key, version) of tensor `t` now."""
        key = storage_key(t)
        return key, self.version[key]

    def ancestors(self, *tensors):
        """The operations whose results flowed into `tensors` (in order of running)."""
        return self._flowed_into([self.latest(t) for t in tensors])

    def ancestors_of_op(self, index):
        """The operations whose results flowed into operation `index`'s inputs."""
        return self._flowed_into([(r.key, r.version) for r in self.ops[index].reads])

    def depends_on(self, tensors, refs):
        """True when one of the (storage key, version) `refs` flowed into `tensors`: what a
        storage held before an operation overwrote all of it (copy_, fill_, an out=) does not
        flow on."""
        return bool(self.flowed([self.latest(t) for t in tensors]) & set(refs))

    def flowed(self, refs):
        """Every (storage key, version) that flowed into `refs`, these included."""
        seen = set()
        self._flowed_into(list(refs), exact=True, seen=seen)
        return seen

    def _flowed_into(self, todo, exact=False, seen=None):
        """The operations that produced the (key, version) refs `todo`, and their producers'
        (`exact`: not through the old contents of a storage an operation overwrote whole)."""
        seen, found = set() if seen is None else seen, set()
        while todo:
            ref = todo.pop()
            if ref in seen:
                continue
            seen.add(ref)
            index = self.producer.get(ref)
            if index is None:
                continue
            found.add(index)
            op = self.ops[index]
            todo.extend((r.key, r.version) for i, r in enumerate(op.reads)
                        if not (exact and i in op.blind))
        return [self.ops[i] for i in sorted(found)]


def _flop_registry():
    return _FLOPS
