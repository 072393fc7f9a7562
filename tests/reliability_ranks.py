"""Rank functions for tests/test_data.py and tests/test_loopback.py (a spawned rank imports its
function by name)."""
import os
from pathlib import Path

import torch.distributed as dist


def summary(ds):
    """What a load gave, in a few numbers (a torchvision dataset's uint8 images and labels)."""
    return dict(n=len(ds), classes=ds.targets.bincount().tolist(),
                pixels=int(ds.data[:, ::4, ::4].sum()))


def load_at_once(rank, world, cfg):
    """`cfg["trials"]` times: rank 0 leaves only the four .gz archives in cfg["root"] (the
    README's offline set-up), then every rank loads a split (cfg["train"]) at the same moment.
    Returns what each load gave, or the error it raised, per trial."""
    os.environ["COURSE_DATA"] = cfg["root"]
    import helpers
    from helpers import data
    raw = Path(cfg["root"]) / "FashionMNIST" / "raw"
    out = []
    for _ in range(cfg["trials"]):
        dist.barrier()
        if rank == 0:
            for name in [*data.EXTRACTED_SIZES, data.VERIFIED]:
                (raw / name).unlink(missing_ok=True)
        dist.barrier()                    # every rank starts on a folder of archives only
        try:
            out.append(summary(helpers.fashion_mnist(cfg["train"])))
        except Exception as e:            # what a rank of a real job would die of
            out.append(f"{type(e).__name__}: {e}")
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
