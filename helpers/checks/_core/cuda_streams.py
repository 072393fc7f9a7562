"""The streams of the simulated GPUs (cuda_calls.py's stand-ins, time_it's AsyncGPUs, FakeGPUs):
which stream is current, per thread and device as CUDA keeps it, and what each stream and the
host are known to run after.

A stream is (device index, id): id 0 is the device's default stream, each `torch.cuda.Stream(d)`
a new id. Work queued on a stream runs after the work queued on it before, after what the stream
was made to wait for (wait_stream, wait_event) and after what the host had waited for when it
queued the work (a synchronize); nothing else orders two streams (gpus.ipynb, "Streams"). Each
stream keeps a vector clock: how many items of each stream it runs after."""
import itertools
import threading
import time

__all__ = ["Streams", "Waits", "sleep_until"]


class Streams:
    """The current device and streams of each thread, and the vector clocks."""

    def __init__(self):
        self._local = threading.local()
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._seen = {}          # stream -> {stream: how many of its items it runs after}
        self._host = {}          # {stream: how many of its items the host waited for}

    # --- the current device and streams (a thread's own, as CUDA's) ----------------------------
    def device(self):
        return getattr(self._local, "i", 0)

    def set_device(self, i):
        self._local.i = i

    def _currents(self):
        if not hasattr(self._local, "streams"):
            self._local.streams = {}
        return self._local.streams

    def current(self, i):
        """Device i's current stream in this thread (its default stream unless one is set)."""
        return self._currents().get(i, (i, 0))

    def set_current(self, stream):
        """`stream` current on its device, in this thread (torch.cuda.set_stream)."""
        self._currents()[stream[0]] = stream

    def new(self, i):
        """A new stream of device i (torch.cuda.Stream)."""
        return (i, next(self._ids))

    # --- what runs after what ------------------------------------------------------------------
    def _clock(self, stream):
        """`stream`'s clock, joined with what the host waited for (its next item is queued now,
        after the host's waits)."""
        clock = self._seen.setdefault(stream, {})
        _join(clock, self._host)
        return clock

    def launch(self, stream):
        """One item queued on `stream` now: its number on that stream."""
        with self._lock:
            clock = self._clock(stream)
            clock[stream] = clock.get(stream, 0) + 1
            return clock[stream]

    def stamp(self, stream):
        """What an event recorded on `stream` now comes after: a copy of its clock."""
        with self._lock:
            return dict(self._clock(stream))

    def wait(self, stream, stamp):
        """`stream`'s later items run after `stamp` (wait_event; wait_stream's event)."""
        with self._lock:
            _join(self._clock(stream), stamp)

    def waited(self, stamp):
        """The host waited for `stamp` (a synchronize returned): every item queued later, on
        any stream, runs after it."""
        with self._lock:
            _join(self._host, stamp)

    def streams_of(self, i):
        """The streams of device i that were given work or made to wait."""
        with self._lock:
            return [s for s in self._seen if s[0] == i] or [(i, 0)]

    def covers(self, stamp, i):
        """Whether `stamp` comes after every item queued on device i so far (on any stream)."""
        with self._lock:
            return all(stamp.get(s, 0) >= self._seen[s].get(s, 0)
                       for s in self._seen if s[0] == i)

    def host_waited(self, stream, n):
        """Whether the host waited for item n of `stream` (a synchronize returned after it)."""
        with self._lock:
            return self._host.get(stream, 0) >= n

    def ordered(self, stream, writer, n):
        """Whether an item queued on `stream` now runs after item n of `writer`."""
        with self._lock:
            return (self._seen.get(stream, {}).get(writer, 0) >= n
                    or self._host.get(writer, 0) >= n)


def _join(clock, other):
    for s, n in other.items():
        if clock.get(s, 0) < n:
            clock[s] = n


class Waits:
    """The waits of simulated GPUs that run nothing (FakeGPUs): a synchronize, a query that
    returned True or an event's synchronize returns at once, and tells the host what it waited
    for; an event stamps its stream's clock (and the host's time, for elapsed_time)."""

    def __init__(self):
        self.streams = Streams()

    def synchronize(self, i):
        """torch.cuda.synchronize(i): every stream of device i."""
        for s in self.streams.streams_of(i):
            self.streams.waited(self.streams.stamp(s))

    def stream_sync(self, stream):
        """Stream.synchronize: that stream only."""
        self.streams.waited(self.streams.stamp(stream))

    def stream_done(self, stream):
        """Stream.query: True (nothing runs), and the host then knows it is done."""
        self.stream_sync(stream)
        return True

    def record(self, stream):
        """An event recorded on `stream` now: (device index, time reached, clock, stream)."""
        return stream[0], time.perf_counter(), self.streams.stamp(stream), stream

    def reached(self, at):
        """Event.synchronize."""
        self.streams.waited(at[2])

    def done(self, at):
        """Event.query: True, as `reached`."""
        self.reached(at)
        return True

    def hold(self, stream, at):
        """Stream.wait_event: `stream`'s later items run after the event."""
        self.streams.wait(stream, at[2])


def sleep_until(t):
    """Sleep until time.perf_counter() reaches t (a simulated GPU's wait)."""
    wait = t - time.perf_counter()
    if wait > 0:
        time.sleep(wait)
