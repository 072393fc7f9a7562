"""The fake GPU's streams and events (tests/fake_cuda.py): with comm_seconds, a timeline of when
each stream has run what it was given, measured on the real host clock."""
import time

_REAL_CLOCK = time.perf_counter     # the host's clock, before the fake GPU patches it


def _sleep_until(t):
    while _REAL_CLOCK() < t:
        time.sleep(t - _REAL_CLOCK())


class FakeStream:
    def __init__(self, gpu):
        self.gpu = gpu
        self.ready = 0.0       # when it has run what it was given (comm_seconds: its waits)
        gpu.streams.append(self)

    def synchronize(self):
        _sleep_until(self.ready)
        self.gpu.synced()

    def wait_stream(self, other):
        self.ready = max(self.ready, other.ready)

    def wait_event(self, event):
        self.ready = max(self.ready, event.t or 0.0)

    def record_event(self, event=None):
        event = event or FakeEvent(self.gpu)
        event.record(self)
        return event

    def query(self):
        return not self.gpu.pending

    def is_capturing(self):
        return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeEvent:
    def __init__(self, gpu):
        self.gpu, self.t, self.done = gpu, None, False

    def record(self, stream=None):
        """It fires when its stream gets there: now, or once what the stream waits for ran."""
        stream = stream or self.gpu.current_stream()
        self.t, self.done = max(_REAL_CLOCK(), stream.ready), not self.gpu.pending

    def synchronize(self):
        _sleep_until(self.t or 0.0)
        self.gpu.synced()
        self.done = True

    def wait(self, stream=None):
        pass

    def query(self):
        return self.done or not self.gpu.pending

    def elapsed_time(self, end):
        if not (end.done or not self.gpu.pending):
            self.gpu.note("a timer that does not synchronise", "Event.elapsed_time() before "
                          "the end event completed (end.synchronize() first)")
        return (end.t - self.t) * 1e3
