"""Joining the process group: THE ONLY place that calls init_process_group (torchrun and
launch alike), and the rank, device and backend rules every rank follows.

One process per rank. Every function works the same under `torchrun` (ranks from the environment)
and under the launcher (ranks passed in). The rules it encodes (see the notes on what learners hit):
- The backend first: NCCL only when every rank on this machine has a GPU of its own; gloo
  otherwise (no GPU, or more ranks than GPUs: two NCCL ranks on one GPU fail with "Duplicate GPU
  detected"). On several machines nothing falls back by itself: a machine that cannot give each
  rank a GPU refuses to start unless the backend is named (every machine must pick the same).
- Then the device: GPU `local_rank` under NCCL (made current with `torch.cuda.set_device`
  before anything touches CUDA, and bound to the group with `device_id`); under gloo the CPU,
  unless every rank on this machine has a GPU of its own (gloo then stages CUDA tensors through
  host memory). A rank computing on the CPU never touches CUDA (no context on a GPU it does
  not use).
- A `timeout` on the process group, so a dead or divergent rank ends the run with an error.
- Ranks started on one machine meet at a store that listens on 127.0.0.1 only (torch's own
  listens on every interface, without authentication); under torchrun the store is torchrun's.
"""
import ctypes
import datetime
import gc
import math
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist

from ..devices import exact_float32, num_gpus
from ..validate import validate_backend, validate_positive_int
from ..words import plural

__all__ = ["choose_backend", "backend_line", "backend_for", "env_ranks", "rank_device", "setup",
           "teardown", "free_port",
           "get_rank", "get_world_size", "log0", "die_with_parent", "pin_to_core"]

_watched = False


def choose_backend(local_world_size: int = 1) -> str:
    """"nccl" when every one of the `local_world_size` ranks on this machine has its own GPU,
    "gloo" otherwise (no GPU, or ranks outnumbering GPUs)."""
    if dist.is_nccl_available() and 0 < local_world_size <= num_gpus():
        return "nccl"
    return "gloo"


def backend_line(world: int, backend: str | None = None) -> str:
    """One line saying which backend `world` ranks on this machine get, and why."""
    gpus = num_gpus()
    chosen = backend or choose_backend(world)
    if chosen == "nccl":
        return f"{plural(world, 'rank')}, one GPU each: NCCL"
    if backend:
        return f"{plural(world, 'rank')}, gloo on the CPU (asked for), one thread per rank"
    if gpus:
        return (f"{world} ranks but {plural(gpus, 'GPU')}: ranks outnumber GPUs, so gloo, "
                "computing on the CPU")
    return f"{plural(world, 'rank')} on the CPU (no GPU): gloo, one thread per rank"


def backend_for(*worlds: int) -> str:
    """One backend for launches of these numbers of ranks (a chapter's): NCCL only when the
    largest gets a GPU per rank. Passed to each launch, it keeps one table from mixing runs on
    GPUs with runs on CPU cores (1 rank on a GPU beside 2 ranks falling back to gloo)."""
    for w in worlds:
        validate_positive_int(w, "world")
    return choose_backend(max(worlds))


def env_ranks() -> tuple[int, int, int, int]:
    """(rank, local_rank, world_size, local_world_size) as torchrun sets them; (0, 0, 1, 1) when
    the process was started without a launcher."""
    e = os.environ
    world_size = int(e.get("WORLD_SIZE", 1))
    return (int(e.get("RANK", 0)), int(e.get("LOCAL_RANK", 0)), world_size,
            int(e.get("LOCAL_WORLD_SIZE", world_size)))


def rank_device(local_rank: int, backend: str = "nccl",
                local_world_size: int | None = None) -> torch.device:
    """This rank's device under `backend`: GPU `local_rank` with NCCL, and with gloo when each of
    the `local_world_size` ranks on this machine has a GPU of its own; the CPU otherwise. A GPU
    is made the current CUDA device; for the CPU (and on a machine without GPUs) nothing
    touches CUDA."""
    n = num_gpus()
    local_world_size = local_world_size or local_rank + 1
    if n == 0 or (backend != "nccl" and local_world_size > n):
        return torch.device("cpu")
    if local_rank >= n:
        raise RuntimeError(f"local rank {local_rank} has no GPU of its own ({n} here): run at "
                           f"most {plural(n, 'rank')} per machine with NCCL, or use gloo")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    return device


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for MASTER_PORT / --rdzv-endpoint)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(rank: int | None = None, world_size: int | None = None, local_rank: int | None = None,
          local_world_size: int | None = None, backend: str | None = None, timeout: float = 60,
          master_addr: str | None = None, master_port: int | None = None,
          device: str | torch.device | None = None) -> tuple[int, int, torch.device]:
    """Join the process group and pick this rank's device. Returns (rank, world_size, device).

    Under torchrun call it without arguments. Started another way on one machine
    (helpers.launch, scripts/ddp/spawn.py) pass rank, world_size and a master_port (all ranks
    the same). `timeout` (seconds) bounds every collective: a rank that
    waits longer for its peers raises instead of hanging. device="cpu": compute on the CPU
    whatever the machine has (a gloo rank then never touches CUDA).
    """
    env_rank, env_local, env_world, env_local_world = env_ranks()
    spawned = rank is not None   # started on one machine: local rank = rank
    rank = rank if spawned else env_rank
    world_size = world_size if world_size is not None else env_world
    if local_rank is None:
        local_rank = rank if spawned else env_local
    if local_world_size is None:
        local_world_size = world_size if spawned else env_local_world
    if master_addr is not None or spawned or "MASTER_ADDR" not in os.environ:
        # started on one machine: this one, whatever MASTER_ADDR a shell left behind
        os.environ["MASTER_ADDR"] = master_addr or "127.0.0.1"
    if master_port is not None:
        os.environ["MASTER_PORT"] = str(master_port)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a finite number of seconds above 0, got {timeout!r}: "
                         "e.g. timeout=60")
    backend = validate_backend(backend, local_world_size) or \
        _auto_backend(local_world_size, world_size)
    if device is not None and torch.device(device).type == "cpu" and backend == "nccl":
        raise ValueError("device=\"cpu\" with backend nccl: NCCL moves CUDA tensors only; "
                         "use backend=\"gloo\" for ranks that compute on the CPU")
    parent = multiprocessing.parent_process()     # only to know who started us, if anyone did
    if spawned and parent is not None:
        die_with_parent(parent.pid)   # mp.spawn's ranks (scripts/ddp/spawn.py): no orphans
    device = torch.device("cpu") if device is not None and torch.device(device).type == "cpu" \
        else rank_device(local_rank, backend, local_world_size)
    exact_float32()   # the course compares ranks with one process: no TF32 on Ampere and newer
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        # ranks sharing a CPU: split its cores, or their threads fight (torchrun sets 1 per rank)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))
    timeout = datetime.timedelta(seconds=timeout)
    store = _attempt_store(timeout)
    if store is None and spawned and os.environ["MASTER_ADDR"] in ("127.0.0.1", "localhost"):
        store = _loopback_store(rank, world_size, int(os.environ["MASTER_PORT"]), timeout)
    bound = {"device_id": device} if backend == "nccl" else {}   # NCCL's communicator now
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout,
                            **({"store": store} if store is not None else {}), **bound)
    return rank, world_size, device


def _auto_backend(local_world_size, world_size):
    """choose_backend on one machine. On several (ranks elsewhere too), each machine would
    choose alone, and one without a GPU per rank would pick gloo while the others pick NCCL:
    a group that hangs at its first collective. There, only NCCL is picked by itself."""
    backend = choose_backend(local_world_size)
    if backend != "nccl" and world_size != local_world_size:
        raise RuntimeError(
            f"{plural(local_world_size, 'rank')} on this machine but {plural(num_gpus(), 'GPU')}"
            ": it would fall "
            f"back to gloo, while a machine with a GPU per rank picks NCCL, and the {world_size}"
            " ranks would never meet. On several machines name the backend on every one "
            "(--backend gloo, or setup(backend=\"gloo\")), or give each rank a GPU")
    return backend


def _attempt_store(timeout):
    """Under torchrun, the launcher's key-value store with keys private to this attempt.

    After `--max-restarts` restarts the group, the new ranks would otherwise find the addresses
    the dead attempt published there and try to connect to them (seen with torch 2.14:
    "Gloo connectFullMesh failed ... Connection refused", then another restart)."""
    e = os.environ
    if e.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "TORCHELASTIC_RESTART_COUNT" not in e:
        return None
    store = dist.TCPStore(e["MASTER_ADDR"], int(e["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    return dist.PrefixStore(f"/course/attempt_{e['TORCHELASTIC_RESTART_COUNT']}", store)


def _loopback_store(rank, world_size, port, timeout):
    """The store ranks on this machine meet at, its server on 127.0.0.1 only: rank 0 binds the
    socket itself and hands it to torch (TCPStore's master_listen_fd), since torch's own server
    listens on every interface. Where torch refuses the socket, its own server, as before."""
    if rank != 0:
        return dist.TCPStore("127.0.0.1", port, world_size, False, timeout)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(max(128, world_size))
    except OSError:
        sock.close()
        raise
    for use_libuv in (True, False):   # (older torch: the libuv server takes no socket)
        try:
            store = dist.TCPStore("127.0.0.1", port, world_size, True, timeout,
                                  master_listen_fd=sock.fileno(), use_libuv=use_libuv)
        except (RuntimeError, TypeError, ValueError):
            continue
        sock.detach()                 # the store owns the socket now: Python must not close it
        return store
    sock.close()
    return dist.TCPStore("127.0.0.1", port, world_size, True, timeout)


def teardown() -> None:
    """Leave the process group (safe to call when there is none).

    Objects that hold the group (a DDP model's reducer) keep it, and gloo's threads, alive past
    destroy_process_group; freed only at interpreter exit, they can abort the process ("terminate
    called without an active exception") or hang it (seen with torch 2.11). Drop such objects
    before calling this (`del model`); unreachable ones (reference cycles) are collected here."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def get_rank() -> int:
    """This process's rank, 0 outside a process group (a notebook, a script run alone)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_world_size() -> int:
    """How many ranks the process group has, 1 outside one."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def log0(*args, **kwargs) -> None:
    """print() on rank 0 only: one log, not one per rank."""
    if get_rank() == 0:
        print(*args, **kwargs, flush=True)


def die_with_parent(parent: int) -> None:
    """This rank leaves when `parent` (the process that started it) dies, whatever killed it
    (SIGTERM, Ctrl-C, a killed kernel): the kernel signals it on Linux (PR_SET_PDEATHSIG), a
    thread that watches the parent's pid covers the rest. Once per process."""
    global _watched
    if _watched:
        return
    _watched = True
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass

    # Started by a fork server, this process's parent is the server (which leaves when the
    # caller dies, and PR_SET_PDEATHSIG then fires); `parent` is watched by its pid.
    forked = os.getppid() != parent

    def alive():
        if not forked:
            return os.getppid() == parent
        try:   # a zombie (dead, not yet reaped by its own parent) still answers kill(pid, 0)
            with open(f"/proc/{parent}/stat", "rb") as f:
                return f.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
        except (OSError, IndexError):
            pass
        try:
            os.kill(parent, 0)   # PermissionError: it runs, as another user
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def watch():
        while alive():
            time.sleep(0.5)
        os._exit(1)
    if not alive():       # it died before prctl took effect
        os._exit(1)
    threading.Thread(target=watch, daemon=True).start()


def pin_to_core(rank: int) -> int | None:
    """One thread, pinned to core `rank` modulo the cores this process may use; returns it.

    Without pinning, k processes on k cores may share one while another idles; without one thread
    each, every process would spread over all cores and the k processes would fight for them."""
    torch.set_num_threads(1)
    if not hasattr(os, "sched_setaffinity"):   # macOS, Windows: no pinning, one thread still
        return None
    cores = sorted(os.sched_getaffinity(0))
    core = cores[rank % len(cores)]
    os.sched_setaffinity(0, {core})
    return core
