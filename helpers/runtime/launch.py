"""Starting ranks: THE ONLY place that starts processes (or threads) to play ranks.

`launch(fn, world, cfg)` runs fn(rank, world, cfg) on `world` ranks and returns what each
returned, in rank order. Processes by default, forked from a fork server that has imported
torch and helpers once (a rank starts in a fraction of a second, not the seconds an import of
torch takes): each joins the default process group first (runtime.group.setup: gloo on a CPU,
NCCL with one GPU per rank), runs with one intra-op thread, finds its device in cfg["device"]
and hands its result back through a file written atomically.
A rank that raises, dies or hangs past `timeout` ends the call with RankFailed or LaunchTimeout
naming the rank and the cause; the other process ranks are killed, never left running (thread
ranks cannot be: each stops at its next comm call, see runtime.thread_world). The ranks die
with the caller (Ctrl-C, SIGTERM, a killed kernel) instead of running on as orphans.
`threads=True` runs fn as thread ranks of a ThreadWorld (runtime.thread_world), talking through
the ThreadComm in cfg["comm"] (any callable works, also one defined in a notebook).

Inside a rank, `report_progress(step, total, what)` (runtime.progress) shows how far it got on
the caller's one progress line, updated in place while the ranks run.
"""
import difflib
import inspect
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..validate import validate_backend, validate_positive_int
from .errors import TAIL, LaunchTimeout, RankFailed
from .files import atomic_save, write_json
from .group import backend_line, choose_backend, free_port
from .progress import ProgressLine, RankStderr

__all__ = ["launch", "take", "take_kwargs", "run_ranks", "run_in_turn"]

_GRACE = 10.0      # seconds a rank that has handed in its result may take to leave the group
_NO_MAIN_GUARD = 86   # a rank's exit code: it started by re-running a script without the guard


# fn(rank, world, cfg) -> this rank's result: what launch runs on every rank
Target = Callable[[int, int, dict[str, Any]], Any]


def launch(fn: Target, world: int, cfg: Mapping[str, Any] | None = None, *,
           backend: str | None = None, timeout: float = 300.0, threads: bool = False,
           quiet: bool = False) -> list[Any]:
    """Run fn(rank, world, cfg) on `world` ranks; returns [what rank 0 returned, ...].

    Processes (default): `fn` must be importable (defined in a module, not a notebook), `cfg`
    picklable; cfg["device"] is the rank's device. backend: None (gloo on the CPU, NCCL when
    every rank has a GPU of its own), "gloo" or "nccl". threads=True: ranks are threads with a
    ThreadComm in cfg["comm"] (no process group). quiet: no backend line, no progress line."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # a rank starting up re-runs the caller's script, and so this call: leave at once,
        # quietly (the caller says why, once), instead of multiprocessing's traceback
        os._exit(_NO_MAIN_GUARD)
    validate_positive_int(world, "world")
    if not callable(fn):
        raise TypeError(f"launch: fn must be a function fn(rank, world, cfg), got {fn!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"launch: timeout must be a finite number of seconds above 0, got "
                         f"{timeout!r}: e.g. timeout=300")
    cfg = dict(cfg or {})
    if threads:
        return _launch_threads(fn, world, cfg, timeout)
    _validate_importable(fn)
    line = backend_line(world, validate_backend(backend, world))
    backend = backend or choose_backend(world)
    try:
        pickle.dumps(cfg)
    except Exception as e:   # any pickling error is the same mistake
        raise TypeError(f"launch: cfg must pickle to reach the ranks (numbers, strings, tensors, "
                        f"lists and dicts of them): {type(e).__name__}: {e}") from None
    if not quiet:
        print(line, flush=True)
    return _launch_processes(fn, world, cfg, backend, timeout, quiet)


def take(cfg: Mapping[str, Any], *required: str, **defaults: Any) -> list[Any]:
    """The values of a launch target's cfg, in order: the `required` keys, then the keys of
    `defaults` (their default when absent). A key it does not expect is an error (a typo would
    otherwise run the default silently); "device" and "comm" may always be there."""
    known = [*required, *defaults]
    unknown = sorted(set(cfg) - set(known) - {"device", "comm"})
    missing = [k for k in required if k not in cfg]
    if unknown or missing:
        near = [f"{k!r} -> {m[0]!r}" for k in unknown
                if (m := difflib.get_close_matches(k, known, n=1))]
        raise TypeError(f"cfg {'lacks ' + str(missing) if missing else ''}"
                        f"{' and ' if unknown and missing else ''}"
                        f"{'has unexpected ' + str(unknown) if unknown else ''}"
                        f"{' (a typo? ' + ', '.join(near) + ')' if near else ''}: "
                        f"expected {list(required)} and optionally {list(defaults)}")
    return [cfg[k] for k in required] + [cfg.get(k, v) for k, v in defaults.items()]


def take_kwargs(cfg: Mapping[str, Any], fn: Callable[..., Any]) -> dict[str, Any]:
    """A nested cfg (a model's sizes) as the keyword arguments of `fn` (a constructor): each of
    fn's parameters with its value in cfg, else fn's own default, the one place defaults live;
    a key fn does not take is an error, as in `take`."""
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = [p.name for p in params if p.default is p.empty]
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    return dict(zip([*required, *defaults], take(cfg, *required, **defaults), strict=True))


def _validate_importable(fn):
    """A spawned rank finds `fn` by module and name: refuse what it could not find."""
    name = getattr(fn, "__name__", repr(fn))
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    found = sys.modules.get(mod) if mod not in (None, "__main__") else None
    for part in qual.split(".") if found is not None else ():
        found = getattr(found, part, None)
    if found is not fn:
        where = "in the notebook (or the script run as __main__)" if mod in (None, "__main__") \
            else "inside a function, or as a lambda or partial"
        raise ValueError(f"launch: {name} is defined {where}, so a spawned rank cannot import it. "
                         f"Move {name} into a module (e.g. helpers/<split>/experiments.py) and "
                         "import it from there, or run the ranks as threads: "
                         "launch(..., threads=True)")


@contextmanager
def _environ(**values):
    """os.environ with `values` set (spawned children copy it at start), restored after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# What the fork server imports once, so that a rank starts in a fraction of a second instead of
# importing torch again (2-3 s of CPU per rank, most of a small launch's time). torchvision too:
# every rank that loads Fashion-MNIST imports it, and it imports torch._dynamo (1.6 s of CPU a
# rank; in CI's test run, 406 s of CPU in 230 forked ranks before, 200 s after)
_PRELOAD = ["torch", "torch.distributed", "torchvision", "helpers"]


def _context():
    """How ranks start: forked from a fork server (Linux, macOS), a clean process that has
    imported _PRELOAD and nothing else (no CUDA, no caller state), else spawned, each a fresh
    interpreter. Either way CUDA-safe, and fn must be importable. COURSE_START=spawn forces
    the fresh interpreter (a helpers module edited since the server started is seen)."""
    method = os.environ.get("COURSE_START") or (
        "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn")
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"COURSE_START={method!r}: choose forkserver or spawn")
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _launch_processes(fn, world, cfg, backend, timeout, quiet):
    # the ranks' results, errors, progress and stderr: removed however the call ends (a caller
    # killed outright leaves it, with the fork server's socket folder, pymp-*)
    with tempfile.TemporaryDirectory(prefix="launch-", ignore_cleanup_errors=True) as tmp:
        return _run_processes(fn, world, cfg, backend, timeout, quiet, Path(tmp))


def _run_processes(fn, world, cfg, backend, timeout, quiet, out):
    ctx = _context()
    port = free_port()
    # one intra-op thread per rank; this machine only, whatever MASTER_ADDR the caller's
    # environment holds. A forked rank gets the environment from its arguments (the fork
    # server's is the one it started with); a spawned one also copies it at start.
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs = [ctx.Process(target=_rank_main, name=f"rank{r}",
                         args=(r, world, port, backend, fn, cfg, str(out), os.getpid(), timeout,
                               env))
             for r in range(world)]
    progress = ProgressLine(world, out, quiet)
    stderr = RankStderr(out, world)
    try:
        with _environ(OMP_NUM_THREADS="1"):   # the fork server's, if this call starts it
            for p in procs:
                p.start()
        _wait(procs, out, timeout, progress, stderr)
        return [torch.load(out / f"rank{r}.pt", map_location="cpu", weights_only=False)
                for r in range(world)]
    finally:
        progress.close()
        _stop(procs)
        stderr.pump()


def _wait(procs, out, timeout, progress, stderr):
    """Until every rank has handed in its result; RankFailed or LaunchTimeout otherwise."""
    deadline, done_at = time.monotonic() + timeout, None
    while True:
        stderr.pump()
        _raise_first_failure(procs, out, stderr)
        codes = [p.exitcode for p in procs]     # before results: a rank that left wrote its own
        results = [(out / f"rank{r}.pt").exists() for r in range(len(procs))]
        for r, code in enumerate(codes):
            if code == 0 and not results[r]:
                raise RankFailed(r, "exited without handing in a result: the function ended "
                                 "the process (os._exit(0)?); return the result instead",
                                 stderr=stderr.tail(r))
        if all(results):
            done_at = done_at or time.monotonic()
            if all(c is not None for c in codes) or time.monotonic() - done_at > _GRACE:
                return                            # _stop ends a rank stuck leaving the group
        elif time.monotonic() > deadline:
            running = [r for r, ok in enumerate(results) if not ok]
            raise LaunchTimeout(running, timeout, progress.summary())
        progress.update()
        alive = [p.sentinel for p in procs if p.exitcode is None]
        if alive:
            multiprocessing.connection.wait(alive, timeout=0.2)   # wakes when a rank exits
        else:
            time.sleep(0.05)


def _death(code):
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        hint = " (SIGKILL: often the system running out of memory)" if -code == 9 else ""
        return f"died from signal {name}{hint} before handing in a result"
    if code == _NO_MAIN_GUARD:
        return ("started by re-running the script that calls helpers.launch, which launched "
                "again: in a script, call helpers.launch under `if __name__ == \"__main__\":`")
    return (f"exited with code {code} before handing in a result (before running fn if no "
            "traceback of it is above: in a script, is helpers.launch called under "
            "`if __name__ == \"__main__\":`?)")


def _raise_first_failure(procs, out, stderr):
    """RankFailed for the rank whose failure came first: a rank that died without a word (a
    signal) before any that raised, else the earliest exception. The others often fail only
    because of it (their peer is gone); the message names them too."""
    errors, dead = _failures(procs, out)
    if not errors and not dead:
        return
    if not dead:   # a peer that raised ("Connection closed by peer") often only echoes one
        alive = [p.sentinel for p in procs if p.exitcode is None]   # that is dying right now
        if alive and multiprocessing.connection.wait(alive, timeout=1.5):
            time.sleep(0.1)
            errors, dead = _failures(procs, out)
    if dead:
        r, cause, tail = dead[0], _death(procs[dead[0]].exitcode), ""
    else:
        r = min(errors, key=lambda k: errors[k]["time"])
        cause = f"{errors[r]['kind']}: {errors[r]['message']}"
        tail = "\n".join(errors[r]["traceback"].rstrip().splitlines()[-TAIL:])
    echoes = [f"rank {k}: {e['kind']}" for k, e in sorted(errors.items()) if k != r]
    if echoes:
        cause += f" (then {', '.join(echoes)})"
    raise RankFailed(r, cause, tail, stderr=stderr.tail(r) if dead else "")


def _failures(procs, out):
    """({rank: its error record}, [ranks dead without a result or an error record])."""
    import json
    errors, dead = {}, []
    for r, p in enumerate(procs):
        path = out / f"rank{r}.error.json"
        if path.exists():
            errors[r] = json.loads(path.read_text())
        elif p.exitcode not in (None, 0) and not (out / f"rank{r}.pt").exists():
            dead.append(r)
    return errors, dead


def _stop(procs):
    """Terminate the ranks still alive, then kill those that ignore it."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is None:   # never started: a start before it failed
            continue
        p.join(3)
        if p.is_alive():
            p.kill()
            p.join(3)


# ---- inside a rank -------------------------------------------------------------------------
def _rank_main(rank, world, port, backend, fn, cfg, out, parent, timeout, env):
    """A rank: join the group, run fn, hand in its result or its error."""
    from . import progress
    from .group import die_with_parent, setup, teardown
    os.environ.clear()
    os.environ.update(env)
    die_with_parent(parent)
    out = Path(out)
    progress.stderr_to(out / f"rank{rank}.stderr")   # the caller passes it on (RankStderr)
    torch.set_num_threads(1)
    progress.report_to(out / f"rank{rank}.progress")
    code = 0
    try:
        # gloo: tensors stay on the CPU (backend_line), and CUDA is never touched
        _, _, device = setup(rank, world, backend=backend, master_addr="127.0.0.1",
                             master_port=port, timeout=timeout,
                             device="cpu" if backend != "nccl" else None)
        result = fn(rank, world, dict(cfg, device=device))
        atomic_save(result, out / f"rank{rank}.pt")
        del result
    except BaseException as e:   # handed to the caller, whatever it is
        write_json(out / f"rank{rank}.error.json", dict(
            kind=type(e).__name__, message=str(e), traceback=traceback.format_exc(),
            time=time.time()))
        code = 1
    finally:
        teardown()
    # The result (or the error) is handed in: leave without the interpreter's shutdown, where
    # C++ threads still holding Python objects can abort the process (torch 2.11: "terminate
    # called without an active exception") or hang it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ---- threads ---------------------------------------------------------------------------------
def _launch_threads(fn, world, cfg, timeout):
    from .thread_world import ThreadWorld
    # a rank waiting for a message gives up first (timeout / 2), naming what it waited for
    w = ThreadWorld(world, timeout / 2, deadline=timeout, record=False)
    results, errors, alive = w.start(w.rank_body(fn, cfg))
    if errors:
        r, e = errors[0]
        tb = "".join(traceback.format_exception(e))
        tail = "\n".join(tb.rstrip().splitlines()[-TAIL:])
        raise RankFailed(r, f"{type(e).__name__}: {e}", tail, original=e) from e
    if alive:
        raise LaunchTimeout(alive, timeout, threads=True)
    return results


# ---- several experiments in one launch -------------------------------------------------------
def run_in_turn(rank: int, world: int, cfg: dict[str, Any]) -> dict[str, Any]:
    """A launch target running cfg["runs"], [(label, fn, kwargs), ...], one after another on
    every rank (fn(rank, world, dict(kwargs, device=..., comm=... on thread ranks)), a barrier
    between them, which a thread rank's comm does not count); returns {label: what fn returned}."""
    import torch.distributed as dist

    from .progress import report_progress
    device, runs, comm = take(cfg, "device", "runs", comm=None)
    given = dict(device=device) if comm is None else dict(device=device, comm=comm)
    results = {}
    for i, (label, fn, kwargs) in enumerate(runs):
        report_progress(i + 1, len(runs), f"experiment ({label})")
        results[label] = fn(rank, world, dict(kwargs, **given))
        if comm is None:
            dist.barrier()
        else:                                   # thread ranks: no process group
            comm.all_reduce(torch.zeros(1))
            comm.reset_counts()                 # the next run counts only its own traffic
    return results


def run_ranks(world: int, runs: Iterable[tuple[str, Target, dict[str, Any]]],
              backend: str | None = None, timeout: float = 600.0, threads: bool = False
              ) -> list[dict[str, Any]]:
    """Start `world` ranks once and run the experiments `runs`, [(label, fn, kwargs), ...], in
    turn on each (label: how its result is found, so one fn can run twice, e.g. "fsdp:bf16");
    returns each rank's {label: result}. One launch: the ranks start (seconds) only once.
    threads=True: thread ranks, as launch(..., threads=True) (each fn gets cfg["comm"])."""
    runs = list(runs)
    for run in runs:
        if not (isinstance(run, tuple) and len(run) == 3 and isinstance(run[0], str)
                and callable(run[1]) and isinstance(run[2], dict)):
            raise ValueError(f"run_ranks: {run!r} is not (label, function, kwargs): pass the "
                             "experiment itself, e.g. (\"zero1\", helpers.zero1_vs_one_process, "
                             "{})")
        if not threads:
            _validate_importable(run[1])
    labels = [label for label, _, _ in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"run_ranks: labels {labels} repeat; give each run its own "
                         "(e.g. \"fsdp:bf16\")")
    return launch(run_in_turn, world, dict(runs=runs), backend=backend, timeout=timeout,
                  threads=threads)
