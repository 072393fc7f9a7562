"""The C base class's exits reached by a name built while the answer runs are watched exits
(exits.py's function mode; tests/check_cases.py's form): `getattr(torch._C, "Tensor" + "Base")`,
`type(t).__mro__[1]`, `super(torch.Tensor, t)`, `torch._C._to_dlpack` by a built name, in the
answer's thread, in a thread it starts, and in a World's rank (a thread it starts there: the
rank's own thread has the harness's other function mode). The references scan refuses these
names written out; a name built at run time passes it, so the watch must see the call.
"""
import concurrent.futures
import threading

import numpy as np
import torch
import torch.distributed as dist
from check_cases import exact_from_numbers, other, parametrize_cases, shortcut

READ_OUT = "out of torch into Python numbers"


def _base():
    return getattr(torch._C, "Tensor" + "Base")


@shortcut("check_global_mean_var", "tolist of the C base reached by getattr", READ_OUT)
def global_mean_var_getattr_base(counts, means, variances):
    tl = _base().tolist
    return exact_from_numbers(tl(counts), tl(means), tl(variances))


@shortcut("check_global_mean_var", "numpy of the C base reached by type(t).__mro__", READ_OUT)
def global_mean_var_mro_numpy(counts, means, variances):
    def read(t):
        return type(t).__mro__[1].numpy(t).tolist()
    return exact_from_numbers(read(counts), read(means), read(variances))


@shortcut("check_global_mean_var", "tolist through super(torch.Tensor, t)", READ_OUT)
def global_mean_var_super_tolist(counts, means, variances):
    def read(t):
        return super(torch.Tensor, t).tolist()
    return exact_from_numbers(read(counts), read(means), read(variances))


class _Capsule:
    """Anything with __dlpack__: numpy takes it."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, **kwargs):
        return getattr(torch._C, "_to" + "_dlpack")(self.t)

    def __dlpack_device__(self):
        return (1, 0)


@shortcut("check_global_mean_var", "torch._C._to_dlpack reached by a built name", READ_OUT)
def global_mean_var_built_to_dlpack(counts, means, variances):
    def read(t):
        return np.from_dlpack(_Capsule(t)).tolist()
    return exact_from_numbers(read(counts), read(means), read(variances))


@shortcut("check_global_mean_var", "the C base's tolist in a thread the answer starts",
          READ_OUT)
def global_mean_var_base_in_thread(counts, means, variances):
    out = []
    worker = threading.Thread(target=lambda: out.extend(
        _base().tolist(t) for t in (counts, means, variances)))
    worker.start()
    worker.join()
    return exact_from_numbers(*out)


@other("check_global_mean_var", "operations of the C base reached by a built name")
def global_mean_var_base_operations(counts, means, variances):
    base = _base()
    n = base.sum(counts)
    mean = base.sum(base.mul(counts[:, None], means), 0) / n
    var = base.sum(counts[:, None] * (variances + (means - mean) ** 2), 0) / n
    base.untyped_storage(torch.zeros(1)).nbytes()       # a storage of no value's
    return mean, var


_BOARD = {}


@shortcut("check_sync_bn_input_grad", "other ranks' sums read with the C base's tolist in a "
          "thread", "used a tensor that rank")
def sync_bn_input_grad_base_thread(dy, x_hat, invstd, n):
    r, k = dist.get_rank(), dist.get_world_size()
    s1 = dy.sum(0)
    dist.all_reduce(s1)
    _BOARD["base", r] = (dy * x_hat).sum(0)
    dist.barrier()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:     # (its error reaches the rank)
        read = pool.submit(lambda: [_base().tolist(_BOARD["base", q]) for q in range(k)]).result()
    dist.barrier()
    s2 = torch.tensor([sum(v[j] for v in read) for j in range(dy.shape[1])])
    return invstd * (dy - s1 / n - x_hat * s2 / n)


test_case = parametrize_cases(__name__)
