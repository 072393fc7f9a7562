"""How far launched ranks got: `report_progress` inside a rank, one line in the caller; and what
each rank says on its stderr, passed on to the caller's (RankStderr).

The line is updated in place while the ranks run (a display handle in Jupyter, a carriage return
on a terminal, nothing in logs and CI), appears after 2 s only and is emptied at the end. A kernel
run by a program (the book build, nbval) shows none: an emptied display would still be an output
of the cell, and in a cell with a labelled figure it would take the figure's label too.
"""
import os
import sys
import threading
import time
from contextlib import contextmanager

from .errors import TAIL
from .files import atomic_write

__all__ = ["report_progress", "ProgressLine", "report_to"]   # RankStderr, stderr_to: launch's


_progress_file = None
_last_report = 0.0


def report_to(path):
    """Called by the launcher in each rank: where report_progress writes."""
    global _progress_file
    _progress_file = path


def report_progress(step, total=None, what="step"):
    """From inside a launched rank: "what step/total" for the caller's progress line (cheap:
    at most a few writes a second; a no-op outside launch)."""
    global _last_report
    if _progress_file is None:
        return
    now = time.monotonic()
    if now - _last_report < 0.3 and step != total:
        return
    _last_report = now
    text = f"{what} {step}" + (f"/{total}" if total is not None else "")
    atomic_write(_progress_file, lambda f: f.write(text), mode="w", durable=False)


_NOTE_AFTER = 1.0           # seconds a wait lasts before the rank's progress says it
_waits = threading.Lock()
_wait = None                # [since, text, the progress before] while a rank waits
_watcher = []


@contextmanager
def waiting(text):
    """Inside a launched rank: while the block runs for longer than a second, `text` (what the
    rank waits for) is its progress, which a LaunchTimeout quotes; the progress before comes back
    after. Cheap when the wait is short (no write)."""
    global _wait
    if _progress_file is None:
        yield
        return
    if not _watcher:
        _watcher.append(threading.Thread(target=_watch, daemon=True))
        _watcher[0].start()
    with _waits:
        _wait = [time.monotonic(), text, None]
    try:
        yield
    finally:
        with _waits:
            noted, _wait = _wait, None
            if noted[2] is not None:
                _write(noted[2])


# bound at import: the watcher thread outlives any one call, and must not run a time.sleep that
# a test or a reader's cell replaced later (the checks refuse reader code on a thread they did not
# see start, and this one would run it)
_sleep = time.sleep


def _watch():
    """The thread that notes a long wait in the rank's progress."""
    while True:
        _sleep(_NOTE_AFTER / 4)
        with _waits:
            w = _wait
            if w is not None and w[2] is None and time.monotonic() - w[0] >= _NOTE_AFTER:
                try:
                    w[2] = _progress_file.read_text()
                except OSError:
                    w[2] = ""
                _write(w[1])


def _write(text):
    atomic_write(_progress_file, lambda f: f.write(text), mode="w", durable=False)


class ProgressLine:
    """One line in the caller, updated in place while ranks run: a display handle in Jupyter,
    a carriage return on a terminal, nothing elsewhere (logs, CI). Shown after 2 s only, and
    emptied at the end, so stored outputs keep only the backend line."""

    def __init__(self, world, out, quiet):
        from ..config import in_notebook, someone_watching
        self.world, self.out, self.t0 = world, out, time.monotonic()
        self.mode = None if quiet else ("jupyter" if someone_watching() else None) \
            if in_notebook() else "tty" if sys.stderr.isatty() else None
        self.handle, self.last, self.width = None, 0.0, 0

    def summary(self):
        got = [(r, self._read(r)) for r in range(self.world)]
        said = [f"rank {r}: {s}" for r, s in got if s]
        return f" (last progress: {', '.join(said)})" if said else ""

    def _read(self, r):
        try:
            return (self.out / f"rank{r}.progress").read_text()
        except OSError:
            return ""

    def text(self):
        said = [self._read(r) for r in range(self.world)]
        shown = said[0] if said and len(set(said)) == 1 else \
            ", ".join(f"rank {r} {s}" for r, s in enumerate(said) if s)
        elapsed = time.monotonic() - self.t0
        return f"{self.world} ranks running, {elapsed:.0f} s" + (f": {shown}" if shown else "")

    def update(self):
        now = time.monotonic()
        if self.mode is None or now - self.t0 < 2 or now - self.last < 0.5:
            return
        self.last, line = now, self.text()
        if self.mode == "jupyter":
            from IPython.display import display
            if self.handle is None:
                self.handle = display({"text/plain": line}, raw=True, display_id=True)
            else:
                self.handle.update({"text/plain": line}, raw=True)
        else:
            sys.stderr.write("\r" + line.ljust(self.width))
            sys.stderr.flush()
            self.width = len(line)

    def close(self):
        if self.handle is not None:
            self.handle.update({"text/plain": ""}, raw=True)
        elif self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()


def stderr_to(path):
    """Called by the launcher in each rank: its stderr (fd 2, Python's and C++'s) goes to `path`,
    which the caller reads (RankStderr)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    os.dup2(fd, 2)
    os.close(fd)


class RankStderr:
    """Each rank writes its stderr (fd 2: Python's and C++'s alike) to a file of its own; the
    caller passes it on to its own stderr as it grows and keeps the last lines, so that a rank
    that dies says why in the RankFailed (gloo's "collective mismatch" before its SIGABRT)."""

    def __init__(self, out, world):
        self.paths = [out / f"rank{r}.stderr" for r in range(world)]
        self.offsets, self.last = [0] * world, [b""] * world

    def pump(self):
        for r, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[r])
                    data = f.read()
            except OSError:
                continue
            if data:
                self.offsets[r] += len(data)
                self.last[r] = (self.last[r] + data)[-4096:]
                try:
                    while data:
                        data = data[os.write(2, data):]
                except OSError:
                    pass

    def tail(self, rank):
        self.pump()
        text = self.last[rank].decode(errors="replace")
        return "\n".join(line for line in text.rstrip().splitlines()[-TAIL:])
