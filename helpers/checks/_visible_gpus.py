"""The draws of check_link_between (gpus.py): random `nvidia-smi topo -m` matrices, values of
CUDA_VISIBLE_DEVICES, and the physical GPUs torch then calls cuda:0, cuda:1, ..."""
from ._core import CheckFailed, randint

__all__ = ["topology", "visible", "specs", "permutation", "raises_beyond"]

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
    no such GPU; after it: the repeat is not read); set but empty (no GPU visible: not the same
    as unset), and with a space after each comma (torch strips each entry). Every one on
    every call, in the same order: the telling values are forced, not drawn."""
    perm = [int(i) for i in permutation(g, n)]
    keep = perm[:randint(g, 2, n)]
    bad = str(n + randint(g, 0, 5))
    head = perm[:2]
    tail = [i for i in perm if i not in head][:2]
    return [None, ",".join(map(str, keep)), ",".join(map(str, head + [bad] + tail)),
            ",".join(map(str, perm[::-1])), ",".join(map(str, head + ["-1"] + tail)),
            ",".join(map(str, keep + keep[:1])), ",".join(map(str, head + [bad] + head[:1])),
            ",".join(map(str, head + ["-1"] + head[:1])), "", ", ".join(map(str, perm[1:]))]


def permutation(g, n):
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = randint(g, 0, i)
        order[i], order[j] = order[j], order[i]
    return order


def raises_beyond(fn, topo, spec, shown):
    """cuda:len(shown) does not exist: CUDA stopped at the first invalid entry."""
    i = len(shown)
    call = f"link_between(topo, {spec!r}, 0, {i})"
    try:
        got = fn([row[:] for row in topo], spec, 0, i)
    except (ValueError, IndexError, KeyError, RuntimeError):
        return
    entries = [e.strip() for e in spec.split(",")]
    numbers = [int(e) for e in entries[:next((k for k, e in enumerate(entries)
                                               if not e.isdigit()), len(entries))]]
    if not spec.strip():
        why = "CUDA_VISIBLE_DEVICES set to an empty string hides every GPU (unset shows them all)"
    elif len(set(numbers)) < len(numbers):
        why = ("an index listed twice (before the first entry that is not a number) makes no "
               "GPU visible")
    else:
        why = (f"CUDA makes the GPUs visible up to the first invalid entry ({entries[i]!r}) and "
               f"ignores the rest, so only {len(shown)} are visible")
    raise CheckFailed(f"{call} returned {got!r}, but there is no cuda:{i}: {why}; raise "
                      "ValueError")
