"""Ranks started once and reused for many small jobs: a property test runs hundreds of cases on
real gloo processes, and starting ranks (seconds each) per case would not fit in CI.

    with RankPool(3) as pool:                 # helpers.launch starts the ranks, once
        results = pool.run(fn, dict(x=1))     # fn(rank, world, cfg) on every rank, in turn

`fn` must be importable (a module-level function). A job that raises on some rank comes back
as JobFailed naming the rank; one that hangs past its timeout breaks the pool (its ranks are
killed) and raises JobTimeout, and the next `run` starts fresh ranks.
"""
import os
import shutil
import tempfile
import threading
import time
import traceback
from pathlib import Path

import torch

import helpers
from helpers.runtime.errors import LaunchTimeout, RankFailed
from helpers.runtime.files import atomic_save

__all__ = ["RankPool", "JobFailed", "JobTimeout", "serve"]


class JobFailed(RankFailed):
    """A job raised on some rank: `errors` maps rank -> "Kind: message"; the rank, cause and
    tail a RankFailed names are the first such rank's, so one `except RankFailed` covers both."""

    def __init__(self, errors, tails):
        self.errors, self.tails = errors, tails
        first = min(errors)
        super().__init__(first, errors[first], tail=tails[first])


class JobTimeout(LaunchTimeout):
    """A job still running on the pool's ranks after its timeout (the ranks were killed)."""


def serve(rank, world, cfg):
    """A rank of the pool: run job n when job{n}.pt appears, hand in res{n}.{rank}.pt, until
    `stop`; a `kill` file ends the process at once (a job stuck in a collective)."""
    import torch.distributed as dist
    folder = Path(cfg["dir"])

    def watch():
        while not (folder / "kill").exists():
            time.sleep(0.05)
        os._exit(3)
    threading.Thread(target=watch, daemon=True).start()
    n = 0
    while True:
        job = folder / f"job{n}.pt"
        while not job.exists():
            if (folder / "stop").exists():
                return n
            time.sleep(0.005)
        fn, kwargs = torch.load(job, weights_only=False)
        try:
            out = ("ok", fn(rank, world, dict(kwargs, device=cfg["device"])), "")
        except Exception as e:   # handed to the test
            out = ("error", f"{type(e).__name__}: {e}", traceback.format_exc()[-3000:])
        atomic_save(out, folder / f"res{n}.{rank}.pt")
        if out[0] == "ok":
            dist.barrier()
        n += 1


class RankPool:
    """`world` gloo ranks serving jobs (see the module docstring)."""

    def __init__(self, world, job_timeout=120.0):
        self.world, self.job_timeout = world, job_timeout
        self._start()

    def _start(self):
        self.dir = Path(tempfile.mkdtemp(prefix=f"pool{self.world}-"))
        self.n, self.failure = 0, None

        def body():
            try:
                helpers.launch(serve, self.world, dict(dir=str(self.dir)), backend="gloo",
                               timeout=24 * 3600.0, quiet=True)
            except BaseException as e:   # reported by the next run
                self.failure = e
        self.thread = threading.Thread(target=body, daemon=True, name=f"pool{self.world}")
        self.thread.start()

    def run(self, fn, cfg=None, timeout=None):
        """fn(rank, world, cfg) on every rank; [rank 0's result, ...]."""
        if not self.thread.is_alive():
            self._start()
        n, self.n = self.n, self.n + 1
        atomic_save((fn, dict(cfg or {})), self.dir / f"job{n}.pt")
        deadline = time.monotonic() + (timeout or self.job_timeout)
        paths = [self.dir / f"res{n}.{r}.pt" for r in range(self.world)]
        errors_at = None
        while True:
            done = [p.exists() for p in paths]
            outs = {r: torch.load(p, weights_only=False) for r, p in enumerate(paths) if done[r]}
            errors = {r: o[1] for r, o in outs.items() if o[0] == "error"}
            if errors and errors_at is None:
                errors_at = time.monotonic()
            if all(done) and not errors:
                return [outs[r][1] for r in range(self.world)]
            if errors and (all(done) or time.monotonic() - errors_at > 10):
                if len(errors) < self.world:   # the others wait in a barrier: start afresh
                    self.close(kill=True)
                raise JobFailed(errors, {r: outs[r][2] for r in errors})
            if not self.thread.is_alive():
                raise RuntimeError(f"the pool's ranks ended: {self.failure}")
            if time.monotonic() > deadline:
                self.close(kill=True)
                raise JobTimeout(list(range(self.world)), timeout or self.job_timeout,
                                 progress=f", in job {fn.__name__}")
            time.sleep(0.005)

    def close(self, kill=False):
        (self.dir / ("kill" if kill else "stop")).touch()
        self.thread.join(30)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
