"""What the simulated GPUs answer when an answer reads a value out of a tensor (`.item()`,
`bool(t)`, `torch.equal`, `torch.allclose`): they hold no values, so a placeholder that keeps
the common sanity checks of a right answer true: a number reads 0, a yes/no made by `all()` or
a comparison of whole tensors reads yes (`assert torch.isfinite(t).all()`, `assert
torch.allclose(a, b)`), any other yes/no reads no (`if torch.isnan(t).any(): raise ...`). But
first, where the check handed the simulated run the inputs of the answer's last run on CPU
tensors, the values that run read are replayed, in order, while each read is the same operation
on the same sizes (same_work.py records them, `.tolist()` and `.numpy()` included, one read per
element): a zero-skip guard takes the CPU run's branch, and a failure there is the answer's. The
values themselves are judged on CPU tensors; a run that still fails, or does other work than on
CPU tensors, after reading a placeholder is the simulation's limit, not the answer's (fake.py)."""
import torch

__all__ = ["placeholder", "READS", "read_sizes"]

_WHOLE = frozenset({"equal", "allclose"})
READS = frozenset({"_local_scalar_dense", *_WHOLE})     # the operations that read values out


def read_sizes(args):
    return tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))


def placeholder(recorder, name, args):
    """The value to answer for operation `name` (NotImplemented: run it): the CPU run's, while
    the reads match (`recorder.replay`), else a placeholder."""
    if name not in READS:
        return NotImplemented
    replay = recorder.replay
    if replay and replay[0][0] == (name, read_sizes(args)):
        return replay.pop(0)[1]
    replay.clear()                  # the reads differ from here on: placeholders
    if name in _WHOLE:
        recorder.answered += 1
        return True
    recorder.answered += 1
    dtype = args[0].dtype
    if dtype == torch.bool:
        made = recorder.producer.get(recorder.latest(args[0]))
        return made is not None and recorder.ops[made].name == "all"
    return 0 if not dtype.is_floating_point and not dtype.is_complex else 0.0
