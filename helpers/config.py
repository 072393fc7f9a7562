"""Run sizes: one switch (COURSE_QUICK) shrinks every experiment so CI finishes in minutes."""
import os

from .words import plural

__all__ = ["choose", "quick", "full"]

QUICK_ENV = "COURSE_QUICK"   # set to 1: tiny data subsets, one or two epochs (CI, a quick look)
FULL_ENV = "COURSE_FULL"     # set to 1: full sizes even without a GPU (slow on a laptop)

_told = set()


ON, OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def _flag(name):
    """A switch of the environment: on, off, or refused (a typo must not turn it on)."""
    value = os.environ.get(name, "")
    word = value.strip().lower()
    if word not in ON + OFF:
        raise ValueError(f"{name}={value!r} is neither on nor off: set {name}=1 (on) or "
                         f"{name}=0 (off), or unset it")
    return word in ON


def quick():
    """True when COURSE_QUICK asks for CI-sized runs."""
    return _flag(QUICK_ENV)


def full():
    """True when COURSE_FULL asks for the full sizes on a machine without a GPU."""
    return _flag(FULL_ENV)


def choose(full, small, what="this experiment", *, tiny=None, ranks=None):
    """The sizes for an experiment, saying once when they are not the full ones.

    `full` when the run uses GPUs (or with COURSE_FULL=1), `small` when it computes on CPU cores
    (a reader's laptop), `tiny` in quick mode (CI; defaults to `small`). Usually dicts like
    dict(num_epochs=10). ranks: the largest number of ranks the experiment launches; they use
    GPUs only when each gets one of its own (else gloo on the CPU), so a one-GPU machine runs
    a 2-rank experiment at the CPU size. None: a run in this process (any GPU is used).
    `small` equal to `full` (an experiment sized for CPU cores everywhere) says nothing.
    """
    from .devices import num_gpus

    gpus = num_gpus()
    on_gpu = gpus > 0 if ranks is None else gpus >= ranks
    full_asked = _flag(FULL_ENV)   # read even where a GPU decides: a value it does not know
    if quick():                    # is refused everywhere
        reason, small = f"quick mode ({QUICK_ENV}=1)", small if tiny is None else tiny
    elif not on_gpu and not full_asked:
        reason = (f"no GPU, so it is scaled down (set {FULL_ENV}=1 for the full size)"
                  if not gpus else f"{ranks} ranks but {plural(gpus, 'GPU')}: they run on CPU "
                  f"cores, so it is scaled down (set {FULL_ENV}=1 for the full size)")
    else:
        return full
    if small == full:
        return full                # one size on every machine: nothing was scaled down
    if what not in _told:
        _told.add(what)
        print(f"Running {what} at reduced size: {reason}: {small}")
    return small


def in_notebook():
    """True inside a Jupyter kernel (where figures can be displayed and updated in place)."""
    try:
        from IPython import get_ipython
        return get_ipython() is not None and "IPKernelApp" in get_ipython().config
    except ImportError:
        return False


def someone_watching():
    """True in a kernel driven by a person (JupyterLab, Colab, VS Code), False when a program
    executes the notebook (the book build, nbval, nbconvert: they run cells with stdin off).
    Lines updated in place are for a person; a program would store them as stray outputs."""
    if not in_notebook():
        return False
    from IPython import get_ipython
    kernel = getattr(get_ipython(), "kernel", None)
    return bool(getattr(kernel, "_allow_stdin", True))
