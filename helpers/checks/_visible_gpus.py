"""The draws of check_link_between (gpus.py): random `nvidia-smi topo -m` matrices, values of
CUDA_VISIBLE_DEVICES, and the physical GPUs torch then calls cuda:0, cuda:1, ..."""
from ._core import randint

__all__ = ["topology", "visible", "specs", "permutation"]

LINKS = ("NV4", "NV8", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS")


def topology(g, n):
    """A random symmetric `nvidia-smi topo -m` matrix of n GPUs ("X" on the diagonal)."""
    topo = [["X"] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            topo[a][b] = topo[b][a] = LINKS[randint(g, 0, len(LINKS) - 1)]
    return topo


def visible(spec, n):
    """The physical GPUs cuda:0, cuda:1, ... are, as torch reads CUDA_VISIBLE_DEVICES (None:
    all of them): parsed up to the first entry that is not a number, an index listed twice in
    that part making none visible (torch.cuda._parse_visible_devices); then counted up to the
    first index with no such GPU (the device count)."""
    if spec is None:
        return list(range(n))
    parsed = []
    for entry in spec.split(","):
        entry = entry.strip()
        if not entry.isdigit():
            break
        if int(entry) in parsed:
            return []
        parsed.append(int(entry))
    out = []
    for gpu in parsed:
        if gpu >= n:
            break
        out.append(gpu)
    return out


def specs(g, n):
    """CUDA_VISIBLE_DEVICES values that reorder, drop, stop at an invalid entry, and repeat an
    index (before the first entry that is not a number: none visible, even after an index with
    no such GPU; after it: the repeat is not read)."""
    perm = [int(i) for i in permutation(g, n)]
    keep = perm[:randint(g, 2, n)]
    bad = str(n + randint(g, 0, 5))
    head = perm[:2]
    tail = [i for i in perm if i not in head][:2]
    return [None, ",".join(map(str, keep)), ",".join(map(str, head + [bad] + tail)),
            ",".join(map(str, perm[::-1])), ",".join(map(str, head + ["-1"] + tail)),
            ",".join(map(str, keep + keep[:1])), ",".join(map(str, head + [bad] + head[:1])),
            ",".join(map(str, head + ["-1"] + head[:1]))]


def permutation(g, n):
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = randint(g, 0, i)
        order[i], order[j] = order[j], order[i]
    return order
