"""Numpy views of tensors taken before the ranks started are read-only while an answer runs
(early_views.py): a view of a module-level tensor taken at import, written by one rank and read
through torch by another, fails wherever the answer's module holds it (a global, a dict, a view of
the view, two dicts down, a list in a list), and so do its writeable base and a view made
writeable again; the views come back writeable after the run (tests/check_cases.py's form)."""
import numpy as np
import torch
from check_cases import parametrize_cases, shortcut

_ROWS = torch.zeros(3, 64, dtype=torch.float64)     # made and viewed at import: every rank sees it
_ROWS_NP = _ROWS.numpy()
_HELD = {"rows": _ROWS.numpy()}
_VIEW_OF_VIEW = _ROWS.numpy()[:, :]                       # a view of the tensor's view
_TWO_DOWN = {"held": {"rows": _ROWS.numpy()}}
_LIST_IN_LIST = [[_ROWS.numpy()]]


def _average_through(grads, comm, rows):
    """Each rank writes twice its gradients into its row of `rows` (a view of _ROWS, in numpy:
    no torch operation), then reads every row in torch: the average, with decoy traffic."""
    k, r = comm.world, comm.rank
    flat = torch.cat([g.reshape(-1) for g in grads]).double()
    comm.all_reduce(torch.zeros(1))
    rows[r, :flat.numel()] = flat.numpy() * 2
    comm.all_reduce(torch.zeros(1))
    mean = (_ROWS[:k, :flat.numel()].mean(0) / 2).float()
    comm.all_reduce(torch.zeros(1))
    rows[r, :flat.numel()] = np.zeros(flat.numel())
    for g, m in zip(grads, mean.split([g.numel() for g in grads]), strict=True):
        g.copy_(m.view_as(g))


@shortcut("check_dp_average", "written through a module-level view taken at import", "read-only")
def dp_average_early_view(grads, comm):
    _average_through(grads, comm, _ROWS_NP)


@shortcut("check_dp_average", "a view taken at import, held in a dict", "read-only")
def dp_average_early_view_in_dict(grads, comm):
    _average_through(grads, comm, _HELD["rows"])


@shortcut("check_dp_average", "written through a view of a view taken at import", "read-only")
def dp_average_view_of_view(grads, comm):
    _average_through(grads, comm, _VIEW_OF_VIEW)


@shortcut("check_dp_average", "a view taken at import, two dicts down", "read-only")
def dp_average_view_two_down(grads, comm):
    _average_through(grads, comm, _TWO_DOWN["held"]["rows"])


@shortcut("check_dp_average", "a view taken at import, in a list in a list", "read-only")
def dp_average_view_list_in_list(grads, comm):
    _average_through(grads, comm, _LIST_IN_LIST[0][0])


@shortcut("check_dp_average", "an early view written through the read-only view's base",
          "only through the comm")
def dp_average_early_view_through_base(grads, comm):
    rows = _ROWS_NP
    while isinstance(rows.base, np.ndarray) and rows.base.shape == rows.shape:
        rows = rows.base                 # the swapped-in view's base: the original, writeable
    _average_through(grads, comm, rows)


@shortcut("check_dp_average", "an early view made writeable again",
          "cannot set WRITEABLE")
def dp_average_early_view_made_writeable(grads, comm):
    _ROWS_NP.flags.writeable = True      # numpy allows it while the view's base is writeable
    _average_through(grads, comm, _ROWS_NP)


def test_early_views_come_back_writeable():
    assert _ROWS_NP.flags.writeable and _HELD["rows"].flags.writeable


test_case = parametrize_cases(__name__)
