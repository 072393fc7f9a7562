"""Part IV: torch.profiler without its native log lines, and counting what a step runs.

On a CUDA build without a GPU, the profiler's C++ side (kineto) writes lines such as
"gpuGetDeviceCount failed with code 35" and "profiler_start" straight to file descriptor 2,
past Python's sys.stderr. `profile_cpu` silences that descriptor while the profiler runs.
"""
import contextlib
import os
import sys

__all__ = ["quiet_native_stderr", "profile_cpu", "count_ops"]


@contextlib.contextmanager
def quiet_native_stderr():
    """Send file descriptor 2 (what C++ libraries write to) to /dev/null meanwhile; Python's
    own warnings and errors still reach sys.stderr when it is not that descriptor."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def profile_cpu(fn, steps=1, cuda=None):
    """Run fn() `steps` times under torch.profiler (CPU activity, plus CUDA where there is a
    GPU, or as `cuda` says) and return the profile; the devices are synchronised at the end."""
    import torch
    from torch import profiler
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")   # no native INFO/WARNING lines
    activities = [profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available() if cuda is None else cuda:
        activities.append(profiler.ProfilerActivity.CUDA)
    with quiet_native_stderr(), profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return prof


def count_ops(prof, steps=1):
    """What a profiled step ran, per step: 'python_ops', the top-level aten:: operators (called
    from Python, not those nested inside other operators), and 'backward_nodes', the autograd
    functions that backward ran (each calls a few operators of its own). Nested aten:: events
    (an addmm inside a linear, a copy inside a to) are not counted: they are not separate calls.
    On a GPU each counted call launches one or more kernels."""
    events = prof.events()
    top = [e for e in events if e.cpu_parent is None]
    python_ops = sum(1 for e in top if e.name.startswith("aten::"))
    backward = sum(1 for e in top if e.name.startswith("autograd::engine::evaluate_function"))
    return {"python_ops": python_ops / steps, "backward_nodes": backward / steps}
