"""Part III: the flight recorder, shown on a collective that one rank never joins.

Every process group keeps a ring buffer of its last collectives (which op, which sizes, its
sequence number, its state) while TORCH_FR_BUFFER_SIZE (formerly TORCH_NCCL_TRACE_BUFFER_SIZE,
still read) is above 0: 2,000 by default in recent torch, 0 (off) in older releases.
After a hang, each rank's buffer says how far that rank got; torch's
analyzer (`torchfrtrace DIR`, i.e. torch.distributed.flight_recorder.fr_trace) lines the ranks'
dumps up and names the first collective they do not all share.

Run on 2 ranks by torchrun (the chapter does, with FR_ENV set):
    python -m torch.distributed.run --nproc-per-node 2 -m helpers.flight_recorder DIR
Every rank runs three all-reduces; then rank 0 runs a fourth (an evaluation on rank 0 only),
which rank 1, busy elsewhere, never joins. Rank 0's waits until the timeout. Each rank writes
its buffer to DIR/rank_<r> on demand (`_dump_fr_trace`, `_dump_nccl_trace` under NCCL, private
torch functions): rank 1 once its last collective is done, rank 0 when its fourth has waited
(gloo: timed out; NCCL: half the timeout, still queued); under NCCL the watchdog also dumps on
the timeout (TORCH_NCCL_DUMP_ON_TIMEOUT), to the same files.
"""
import argparse
import os
import pickle
import time

import torch
import torch.distributed as dist

from .runtime.group import setup

__all__ = ["fr_env", "read_dumps", "first_unjoined", "fr_trace_report", "FR_ENTRIES"]

FR_ENTRIES = 2000     # the tutorial's size: ring-buffer entries, one a collective


def fr_env(dump_dir):
    """The variables that size the recorder (on by default in recent torch, off in older) and
    say where its dumps go, set before the process group starts; old and new names alike."""
    prefix = os.path.join(str(dump_dir), "rank_")
    return {"TORCH_FR_BUFFER_SIZE": str(FR_ENTRIES),
            "TORCH_NCCL_TRACE_BUFFER_SIZE": str(FR_ENTRIES),
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": prefix,
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix}


def _fr_dumper(backend):
    """The function that returns this process's flight-recorder buffer (pickled bytes), or
    None where this torch records only NCCL's collectives (gloo's joined the recorder later)."""
    from torch._C import _distributed_c10d as c10d
    if backend == "nccl":
        return c10d._dump_nccl_trace
    return getattr(c10d, "_dump_fr_trace", None)


def _dump(backend, dump_dir, rank):
    dump = _fr_dumper(backend)
    if dump is None:
        print(f"rank {rank}: this torch's gloo has no flight recorder: it needs NCCL",
              flush=True)
        return
    with open(os.path.join(dump_dir, f"rank_{rank}"), "wb") as f:
        f.write(dump())
    print(f"rank {rank}: dumped its flight recorder", flush=True)


def read_dumps(dump_dir):
    """{rank: the rank's dump (a dict: "entries", "pg_config", ...)} from DIR/rank_<r>."""
    out = {}
    for name in sorted(os.listdir(dump_dir)):
        if name.startswith("rank_") and name[5:].isdigit():
            with open(os.path.join(dump_dir, name), "rb") as f:
                out[int(name[5:])] = pickle.load(f)
    if not out:
        raise FileNotFoundError(f"no flight-recorder dumps (rank_<r>) in {dump_dir}: did the "
                                "ranks run with fr_env(dump_dir) set?")
    return out


def first_unjoined(dumps):
    """The first collective (by sequence number) that not every rank recorded:
    (seq, op, {ranks that recorded it}), or None when every rank recorded the same ones."""
    seen = {r: {e["collective_seq_id"]: e["profiling_name"] for e in d["entries"]}
            for r, d in dumps.items()}
    for seq in sorted(set().union(*seen.values())):
        have = {r for r, s in seen.items() if seq in s}
        if have != set(dumps):
            op = next(seen[r][seq] for r in have)
            return seq, op, have
    return None


def _named_groups(dump):
    """The dump with pg_config keyed by the group names its entries use: this torch's gloo
    recorder keys it by "" instead, which stops torch's analyzer (NCCL's dumps agree)."""
    names = {e["process_group"][0]: e["process_group"][1] for e in dump["entries"]}
    config = dump.get("pg_config", {})
    if set(config) <= set(names) or len(config) != len(names):
        return dump
    fixed = {k: dict(v, name=k, desc=names[k]) for k, v in zip(names, config.values(), strict=True)}
    return dict(dump, pg_config=fixed)


def fr_trace_report(dump_dir):
    """What torch's analyzer (torchfrtrace) says about the dumps in `dump_dir`."""
    import subprocess
    import sys
    import tempfile
    with tempfile.TemporaryDirectory(prefix="fr-trace-") as work:
        for rank, dump in read_dumps(dump_dir).items():
            with open(os.path.join(work, f"rank_{rank}"), "wb") as f:
                pickle.dump(_named_groups(dump), f)
        run = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                              work], capture_output=True, text=True, timeout=120)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    return (run.stdout + run.stderr).strip().replace(root, "")   # paths from the checkout


def main(argv=None):
    """The command line: run the flight-recorder demonstration, dumps into `dump_dir`."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dump_dir")
    p.add_argument("--timeout", type=float, default=4.0, help="seconds a collective waits")
    args = p.parse_args(argv)
    if not os.path.isdir(args.dump_dir):
        raise SystemExit(f"flight_recorder: {args.dump_dir} is not a folder: create it first")
    # the course's one way to join (NCCL where every rank here has a GPU, else gloo)
    rank, _, device = setup(timeout=args.timeout)
    backend = dist.get_backend()
    nccl = backend == "nccl"
    x = torch.ones(1024, device=device)
    for _ in range(3):                 # the steps every rank runs
        dist.all_reduce(x)
    if nccl:
        torch.cuda.synchronize()
    if rank == 0:                      # the evaluation on rank 0 only
        try:
            work = dist.all_reduce(x, async_op=True)
            if nccl:                   # queued on the GPU: look while it waits
                time.sleep(args.timeout / 2)
                _dump(backend, args.dump_dir, rank)
            work.wait()
        except RuntimeError as e:      # gloo: the timeout raises here
            print(f"rank 0: {str(e).splitlines()[0][:120]}", flush=True)
        if not nccl:
            _dump(backend, args.dump_dir, rank)
    else:                              # its record is complete: dump it, then
        _dump(backend, args.dump_dir, rank)
        time.sleep(args.timeout + 2)   # be busy elsewhere: never join
    os._exit(0)                        # no teardown: a collective is still open


if __name__ == "__main__":
    main()
