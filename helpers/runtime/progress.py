"""How far launched ranks got: `report_progress` inside a rank, one line in the caller.

The line is updated in place while the ranks run (a display handle in Jupyter, a carriage return
on a terminal, nothing in logs and CI), appears after 2 s only and is emptied at the end. A kernel
run by a program (the book build, nbval) shows none: an emptied display would still be an output
of the cell, and in a cell with a labelled figure it would take the figure's label too.
"""
import sys
import time

from .files import atomic_write

__all__ = ["report_progress", "ProgressLine", "report_to"]

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
