"""Rank functions for tests/test_data.py and tests/test_loopback.py (a spawned rank imports its
function by name)."""
import os
from pathlib import Path

import torch.distributed as dist


def summary(ds):
    """What a load gave, in a few numbers (a torchvision dataset's uint8 images and labels)."""
    return dict(n=len(ds), classes=ds.targets.bincount().tolist(),
                pixels=int(ds.data[:, ::4, ::4].sum()))


def tensors_summary(X, y):
    """The same numbers for what load_tensors gave (images as floats in [0, 1])."""
    return dict(n=len(y), classes=y.bincount().tolist(),
                pixels=int(X[:, 0, ::4, ::4].mul(255).round().long().sum()))


def load_at_once(rank, world, cfg):
    """`cfg["trials"]` times: rank 0 leaves only the four .gz archives in cfg["root"] (the
    README's offline set-up), then every rank loads a split (cfg["train"]) at the same moment,
    then its tensors (load_tensors: one cache of them, decoded and written while the others
    wait or read it). Returns what each load gave, or the error it raised, per trial."""
    os.environ["COURSE_DATA"] = cfg["root"]
    from helpers import data, decoded_cache
    raw = Path(cfg["root"]) / "FashionMNIST" / "raw"
    out = []
    for _ in range(cfg["trials"]):
        dist.barrier()
        if rank == 0:
            for name in [*data.EXTRACTED_SIZES, data.VERIFIED]:
                (raw / name).unlink(missing_ok=True)
            decoded_cache.cache_path(Path(cfg["root"]), cfg["train"]).unlink(missing_ok=True)
        dist.barrier()                    # every rank starts on a folder of archives only
        got = {}
        for what, load in (("dataset", lambda: summary(data.fashion_mnist(cfg["train"]))),
                           ("tensors", lambda: tensors_summary(*data.load_tensors(cfg["train"])))):
            dist.barrier()
            try:
                got[what] = load()
            except Exception as e:        # what a rank of a real job would die of
                got[what] = f"{type(e).__name__}: {e}"
        out.append(got)
    dist.barrier()
    return out


def listening(rank, world, cfg):
    """The local addresses of the sockets listening on MASTER_PORT (Linux: /proc/net/tcp*), as
    (ip hex, port); rank 0 hosts the store there."""
    port = int(os.environ["MASTER_PORT"])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                ip, p = local.split(":")
                if state == "0A" and int(p, 16) == port:   # 0A: LISTEN
                    found.append(ip)
    dist.barrier()
    return found


# --- ranks that do not run the same collectives (tests/test_agree.py) --------------------------

def _net(width_b=8, width_c=8):
    from torch import nn
    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, width_b), nn.Linear(width_b, width_c),
                         nn.Linear(width_c, 8))


def _fsdp_branch(rank, units, width_c=8, finish=True, again=False, first=None):
    """FSDPFromScratch over _net(); the layers run by each rank: `units[rank]`; `again`: a
    second step (`first`: the layers of the first step on every rank, default `units`)."""
    import torch

    import helpers
    torch.manual_seed(0)
    net = _net(width_c=width_c)
    model = helpers.FSDPFromScratch(net)
    for step in range(2 if again else 1):
        x = torch.randn(3, 4)
        for i in (units[rank] if first is None or step else first):
            x = net[i](x)
        x.sum().backward()
        if finish:
            model.finish_gradient_synchronization()


def mismatches(rank, world, cfg):
    """Each case, on every rank: ("ok", None) or (the error's type, its message)."""
    import torch
    from torch import nn

    import helpers
    from helpers.runtime.agree import agree

    def model(width):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, width), nn.Linear(width, 2))

    def clip_on_rank_0():
        torch.manual_seed(0)
        m = helpers.FSDPFromScratch(nn.Sequential(nn.Linear(4, 4)))
        m(torch.randn(2, 4)).sum().backward()
        m.finish_gradient_synchronization()
        if rank == 0:
            m.clip_grad_norm_(1.0)
        else:
            agree("what rank 1 does next")

    def zero2_one_more_backward():
        z = helpers.Zero2(model(4), torch.optim.SGD, lr=0.1)
        for _ in range(2 if rank == 0 else 1):
            z(torch.randn(2, 4)).sum().backward()
        z.finish_gradient_synchronization()

    cases = {
        # a unit only rank 0 runs (a branch on the data), its shard of another size / the same
        "fsdp: unit 1 on rank 0 only": lambda: _fsdp_branch(rank, [[0, 1, 2, 3], [0, 2, 3]], 6),
        "fsdp: same-sized unit 1 on rank 0 only": lambda: _fsdp_branch(
            rank, [[0, 1, 2, 3], [0, 2, 3]]),
        "fsdp: each rank skips another unit": lambda: _fsdp_branch(rank, [[0, 1, 3], [0, 2, 3]]),
        "fsdp: models differ": lambda: helpers.FSDPFromScratch(model(4 + rank)),
        "zero2: models differ": lambda: helpers.Zero2(model(4 + rank), torch.optim.SGD, lr=0.1),
        "zero1: models differ": lambda: helpers.ShardedOptimizer(
            model(4 + rank).parameters(), torch.optim.SGD, lr=0.1),
        "ddp: models differ": lambda: helpers.DDPFromScratch(model(4 + rank)),
        "fsdp: clip on rank 0 only": clip_on_rank_0,
        "fsdp: finish on rank 0 only": lambda: _fsdp_branch(rank, [[0, 1, 2, 3]] * 2,
                                                             finish=rank == 0, again=True),
        "fsdp: a later step mixes two units of one size": lambda: _fsdp_branch(
            rank, [[0, 1, 3], [0, 2, 3]], again=True, first=[0, 1, 2, 3]),
        "fine again": lambda: _fsdp_branch(rank, [[0, 1, 2, 3]] * 2),
        "zero2: one more backward on rank 0": zero2_one_more_backward,   # last: leaves one
    }                                                                     # reduce-scatter open
    out = {}
    for name, case in cases.items():
        try:
            case()
            out[name] = ("ok", None)
        except Exception as e:   # what each rank was told
            out[name] = (type(e).__name__, str(e))
    return out


def agree_alone(rank, world, cfg):
    """Rank 1 leaves; rank 0 agrees alone (a timeout of 1 s): rank 0's error."""
    from helpers.runtime.agree import agree
    if rank == 0:
        try:
            agree("a lonely agreement", timeout=1)
        except TimeoutError as e:
            return str(e)
    return None
