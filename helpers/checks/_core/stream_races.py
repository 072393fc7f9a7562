"""Reads that race a write on another stream, on the simulated GPUs (FakeGPUs).

Each operation the Recorder sees runs on the current stream of its GPU, the thread's
(cuda_streams.py); a copy between two GPUs runs on the source's current stream, after the
destination's current stream and before that stream's later work, as torch's copy orders them.
Work on two streams runs independently: an operation that reads memory another stream wrote,
with no wait_stream, wait_event or synchronize between them, may read it before it is written
(gpus.ipynb, "Streams"), and so may the caller, whose work runs on the default streams, read
what the answer returned or wrote into what it was handed. A non_blocking copy to a GPU from
pinned host memory returns before it runs (from pageable memory it is staged before it returns),
so the host, or another stream, that writes those bytes before the host waited for the copy's
stream may change what the GPU receives (PyTorch's pin_memory/non_blocking tutorial; CUDA's API
synchronization behavior). The mirror: a non_blocking copy to the host lands in pinned memory
(torch pins the result of `.to("cpu", non_blocking=True)`; into pageable memory CUDA returns
once it is done) and returns before it runs, so the host reads those bytes only after it waited
for the copy's stream (`.item()` of a GPU tensor waits for that GPU's current stream, as torch's
does). Only the order of work is followed:
the memory a freed side-stream tensor leaves (record_stream's concern) is not, and the backward
(which runs on its forward's streams) is not judged."""
import torch
from torch.utils._pytree import tree_flatten

from .observe import Recorder, Ref, describe_device, storage_key
from .placeholders import READS
from .reader_objects import is_a

__all__ = ["Races", "stream_recorder", "handed"]


class Races:
    """The writes of each storage on the simulated GPUs: (first byte, end byte, stream, its
    item number there, what wrote it, in words); and the first read that raced one (`found`:
    words). `waits` (cuda_streams.Waits): the stand-ins' waits, on the same streams."""

    def __init__(self, waits):
        self.waits, self.streams = waits, waits.streams
        self.written = {}
        self.pinned = set()     # storage keys of pinned host memory (pin_memory, pin_memory=True)
        self.reading = {}       # key -> (first, end, stream, item) a pinned copy to a GPU reads
        self.landing = {}       # key -> (first, end, stream, item) a copy to the host writes
        self.found = None

    def note(self, op, args, kwargs):
        """Operation `op` (a Recorder's Op) ran now: check its reads, note its writes."""
        if torch._C._current_graph_task_id() != -1:
            return          # a backward: on its forward's streams, not followed
        if op.name == "_pin_memory" or kwargs.get("pin_memory"):
            self.pinned.update(o.key for o in op.outputs)
        run, after = self._placed(op)
        overwrite = self._overwrites(op, run) or self._landed(op, run)
        if overwrite is not None and self.found is None:
            self.found = overwrite
        for i, r in enumerate(op.reads):
            if i in op.blind or i in op.targets or r.device.type != "cuda":
                continue
            late = self._unordered(r, run or self._on(r))
            if late is not None and self.found is None:
                self.found = _raced(op, r, run or self._on(r), late)
        written = [w for w in op.writes + op.outputs if w.device.type == "cuda"]
        on = [run] if run else sorted({self._on(r) for r in op.reads + written} - {None})
        launched = {s: self.streams.launch(s) for s in on}
        for w in written:
            stream = run or self._on(w)
            what = f"{op.name} wrote on {_stream(stream)}"
            if after not in (None, "host"):
                what = (f"a copy from cuda:{run[0]} wrote ({op.name}: torch runs a copy between "
                        f"GPUs on the source's current stream, here {_stream(run)}, and makes "
                        f"only the stream current on cuda:{after[0]} then, {_stream(after)}, "
                        "wait for it)")
            self._wrote(w, stream, launched[stream], what)
        src = op.reads[-1 if op.name == "copy_" else 0] if op.is_transfer else None
        if (src is not None and src.key in self.pinned and after is None and run is not None
                and not _blocking(op, args, kwargs)):       # returned before it read src
            self.reading.setdefault(src.key, []).append((*src.span[:2], run, launched[run]))
        if after == "host":
            dst = (op.writes or op.outputs)[0]
            if _blocking(op, args, kwargs) or not (op.name == "_to_copy" or dst.key in self.pinned):
                self.streams.waited(self.streams.stamp(run))      # it returned once done
            else:       # torch pins a non_blocking _to_copy's result: it returns before it runs
                self.pinned.add(dst.key)
                self.landing.setdefault(dst.key, []).append((*dst.span[:2], run, launched[run]))
        elif after not in (None, "host"):
            self.streams.wait(after, self.streams.stamp(run))

    def _placed(self, op):
        """For a copy between devices: (the stream it runs on, what waits for it after: a
        stream, "host" or None); else (None, None): each tensor's part runs on the current
        stream of its GPU (a foreach operation's on each of its devices)."""
        current = self.streams.current
        if not op.is_transfer:
            return None, None
        src, dst = op.src_device, (op.writes or op.outputs)[0].device
        if src.type == "cuda" and dst.type == "cuda":
            run, after = current(self._index(src)), current(self._index(dst))
            self.streams.wait(run, self.streams.stamp(after))
            return run, after
        if dst.type == "cuda":
            return current(self._index(dst)), None
        return (current(self._index(src)), "host") if src.type == "cuda" else (None, None)

    def _overwrites(self, op, run):
        """Words for `op`'s write (on the host, or a copy's on stream `run`) over pinned host
        bytes that a non_blocking copy to a GPU may still be reading; else None."""
        for w in op.writes:
            if w.device.type != "cpu":
                continue
            for first, end, stream, n in self.reading.get(w.key, ()):
                done = (self.streams.host_waited(stream, n) if run is None
                        else self.streams.ordered(run, stream, n))
                if first < w.span[1] and w.span[0] < end and not done:
                    return _overwritten(op, w, stream, run)
        return None

    def _landed(self, op, run):
        """Words for `op`'s use (on the host, or a copy's on stream `run`) of host bytes a
        non_blocking copy to the host may still be writing; else None."""
        if op.view or op.name in _NO_VALUES:
            return None
        used = [(r, "read") for i, r in enumerate(op.reads)
                if i not in op.blind and i not in op.targets] + [(w, "wrote") for w in op.writes]
        for ref, how in used:
            late = self._landing(ref, run)
            if late is not None:
                return _landing_words(f"{how} a {list(ref.shape)} tensor on the CPU ({op.name}, "
                                      + ("on the host" if run is None
                                         else f"by a copy on {_stream(run)}") + ")", late)
        return None

    def _landing(self, ref, run=None):
        """The stream of a non_blocking copy to the host that may still write the bytes `ref`
        covers, unwaited by the host (or, for a copy on stream `run`, not ordered before it)."""
        if ref.device.type != "cpu":
            return None
        for first, end, stream, n in self.landing.get(ref.key, ()):
            done = (self.streams.host_waited(stream, n) if run is None
                    else self.streams.ordered(run, stream, n))
            if first < ref.span[1] and ref.span[0] < end and not done:
                return stream
        return None

    def read_out(self, name, args):
        """A value read out of tensors (`.item()`, `torch.equal`: answered without running):
        one of a GPU waits for that GPU's current stream, as torch's copy to the host does."""
        for t in tree_flatten(args)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            ref = Ref(t, 0)
            if t.device.type == "cuda":
                self.streams.waited(self.streams.stamp(self._on(ref)))
                continue
            late = self._landing(ref)
            if late is not None and self.found is None:
                how = _READ_OUT.get(name, name)
                self.found = _landing_words(f"read a {list(ref.shape)} tensor on the CPU "
                                            f"({how}, on the host)", late)

    def _on(self, ref):
        """The current stream of the GPU `ref` is on (a CPU tensor's: None)."""
        d = ref.device
        return self.streams.current(self._index(d)) if d.type == "cuda" else None

    def _index(self, device):
        return self.streams.device() if device.index is None else device.index

    def _unordered(self, ref, stream):
        """Words for a write of the bytes `ref` covers that `stream` does not run after."""
        first, end = ref.span[0], ref.span[1]
        for w_first, w_end, writer, n, what in self.written.get(ref.key, ()):
            if (first < w_end and w_first < end and writer != stream
                    and not self.streams.ordered(stream, writer, n)):
                return what
        return None

    def _wrote(self, ref, stream, n, what):
        first, end, dense = ref.span
        kept = [w for w in self.written.get(ref.key, ())
                if not (dense and first <= w[0] and w[1] <= end)]   # overwritten whole
        self.written[ref.key] = kept + [(first, end, stream, n, what)]

    def unwaited(self, tensors):
        """Words for the first of `tensors` (what the answer returned or was handed) whose
        memory a stream wrote that its GPU's default stream (the caller's) does not run after;
        None when every one is waited for."""
        for t in tensors:
            late = self._landing(Ref(t, 0)) if storage_key(t) in self.landing else None
            if late is not None:
                return _landing_words(f"returned a {list(t.shape)} tensor on the CPU (or wrote "
                                      "it into what it was handed)", late,
                                      " when the caller reads it")
            if t.device.type != "cuda" or storage_key(t) not in self.written:
                continue
            ref = Ref(t, 0)
            late = self._unordered(ref, (t.device.index, 0))
            if late is not None:
                return (f"returned a {list(t.shape)} tensor on {describe_device(t.device)} "
                        f"(or wrote it into what it was handed) that {late}, and "
                        f"{_stream((t.device.index, 0))}, where the caller's work runs, never "
                        "waited for it: it may read memory not written yet. Wait for stream s "
                        "before returning what it wrote: torch.cuda.current_stream("
                        f"\"{t.device}\").wait_stream(s)")
        return None


# operations that read no values of a tensor they are handed (zeros_like and its kin: op.blind)
_NO_VALUES = frozenset({"is_pinned", "record_stream", "set_", "resize_", "rand_like",
                        "randn_like", "randint_like"})

_READ_OUT = {"_local_scalar_dense": ".item(), float(), int(), .tolist() or .numpy()",
             "equal": "torch.equal", "allclose": "torch.allclose"}


def _landing_words(what, stream, after=""):
    """Words for a use of host memory that a non_blocking copy to the host on `stream` may
    still be writing."""
    d = f"cuda:{stream[0]}"
    wait = (f"torch.cuda.current_stream(\"{d}\").synchronize() or torch.cuda.synchronize("
            f"\"{d}\")" if stream[1] == 0 else "s.synchronize() on that stream s")
    return (f"{what} that a non_blocking copy to the host from {d} on {_stream(stream)} may "
            f"still be writing{after}: such a copy lands in pinned memory and returns before it "
            "runs, so the host may read bytes not written yet. Make the host wait for the copy "
            f"before using what it copied: {wait}, or synchronize() an event recorded after the "
            "copy (wait_stream, wait_event and record_stream order GPU work, not the host); or "
            "copy with non_blocking=False")


def _blocking(op, args, kwargs):
    """A copy to the host that waits for its stream (non_blocking=False)."""
    if op.name == "copy_" and len(args) > 2:
        return not args[2]
    return not kwargs.get("non_blocking", False)


def _stream(stream):
    i, sid = stream
    return (f"cuda:{i}'s default stream" if sid == 0
            else f"a stream of cuda:{i} made with torch.cuda.Stream")


def _raced(op, ref, run, late):
    d = f"cuda:{run[0]}"
    return (f"ran {op.name} on {_stream(run)}, reading a {list(ref.shape)} tensor on "
            f"{describe_device(ref.device)} that {late}, with no wait between them: work on two "
            "streams runs independently, so it may read memory not written yet. Wait for "
            "stream s before reading what it wrote: "
            f"torch.cuda.current_stream(\"{d}\").wait_stream(s) (or wait_event on an event "
            "recorded on s after the write)")


def _overwritten(op, ref, stream, run):
    """Words for `op`'s write over pinned memory that a copy on `stream` may still read."""
    d = f"cuda:{stream[0]}"
    by = "on the host" if run is None else f"by a copy on {_stream(run)}"
    wait = (f"torch.cuda.current_stream(\"{d}\").synchronize()" if stream[1] == 0
            else "s.synchronize() on that stream s")
    return (f"wrote a {list(ref.shape)} tensor of pinned host memory ({op.name}, {by}) that a "
            f"non_blocking copy to {d} on {_stream(stream)} may still be reading: a copy from "
            "pinned memory with non_blocking=True returns before it runs, so the GPU may receive "
            "the new bytes. Make the host wait for the copy before writing its source again: "
            f"{wait}, or synchronize() an event recorded after the copy (wait_stream, wait_event "
            "and record_stream order GPU work, not the host); or give each device its own "
            "buffer")


def stream_recorder(races, **kwargs):
    """A Recorder whose every recorded operation `races` notes (a class made here, so the
    notes are reached through a closure, never an attribute of the recorder)."""
    note, read_out = races.note, races.read_out

    class StreamRecorder(Recorder):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in READS:     # answered unrecorded (placeholders.py)
                with self._lock:
                    read_out(func.__name__.split(".")[0], args)
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _record(self, func, args, kwargs, inputs, out, unread=()):
            n = len(self.ops)
            super()._record(func, args, kwargs, inputs, out, unread)
            if len(self.ops) > n:
                note(self.ops[-1], args, kwargs)

    return StreamRecorder(**kwargs)


def handed(*trees):
    """The tensors in `trees` (arguments, a result) of torch's own classes (no property of the
    reader's runs): what the caller reads after the answer returns."""
    return [leaf for leaf in tree_flatten(trees)[0] if is_a(leaf, torch.Tensor)
            and type(leaf).__module__.split(".")[0] == "torch"]
