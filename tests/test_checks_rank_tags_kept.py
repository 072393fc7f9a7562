"""A rank's counts keep their rank tag where CPython or a course helper would make them plain
(tests/check_cases.py's form; helpers/checks/_core/rank_builtins.py, helpers/runtime/comm.py):
this module binds `int = builtins.int` itself, as a notebook may, and the stand-in still takes
its place while a World runs; `comm.all_to_all` keeps the tag of the splits it is handed.
Each answer leaves its counts in a module dict instead of telling the other ranks: each fails.
A right answer that sends its counts first passes."""
import builtins
import time

import torch
from check_cases import other, parametrize_cases, shortcut

int = builtins.int   # the module's own name for the builtin: what the test is about

RANKS = "read out of its own tensors"
_OWN_INT, _FROM_DICT = {}, {}      # one table per answer: the tests share this process


def _published(table, w, r, counts):
    """Leave this rank's counts in a module dict; wait until every rank has."""
    for j, c in enumerate(counts):
        table[w, r, j] = c
    while sum(1 for key in list(table) if key[0] == w) < w * w:
        time.sleep(0.001)
    return [table[w, j, r] for j in range(w)]


@shortcut("check_dispatch_tokens", "int() bound to the builtin by the module, recv by hand", RANKS)
def dispatch_tokens_own_int(x, dest, comm):
    w, r = comm.world, comm.rank
    incoming = _published(_OWN_INT, w, r, [int((dest == j).sum()) for j in range(w)])
    for j in range(w):
        if j != r:
            comm.send(x[dest == j], j, tag=1)
    return torch.cat([x[dest == r] if j == r else comm.recv(j, (incoming[j], x.shape[1]), tag=1)
                      for j in range(w)])


@shortcut("check_dispatch_tokens", "counts never sent, comm.all_to_all sized from a dict",
          RANKS)
def dispatch_tokens_all_to_all_from_dict(x, dest, comm):
    w, r = comm.world, comm.rank
    order = torch.argsort(dest, stable=True)
    counts = torch.bincount(dest, minlength=w).tolist()
    incoming = _published(_FROM_DICT, w, r, counts)
    return comm.all_to_all(x[order], counts, incoming)


@other("check_dispatch_tokens", "counts sent first with comm.all_to_all, int() of the module")
def dispatch_tokens_counts_sent(x, dest, comm):
    w = comm.world
    order = torch.argsort(dest, stable=True)
    counts = torch.bincount(dest, minlength=w)
    incoming = comm.all_to_all(counts, [1] * w, [1] * w)
    return comm.all_to_all(x[order], [int(c) for c in counts],
                           [int(c) for c in incoming])


test_case = parametrize_cases(__name__)
