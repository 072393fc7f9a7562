"""The command line of the DDP scripts (single.py, spawn.py, torchrun.py): one parser, and every
argument, the snapshot to resume from and the data folder checked before any process group,
data or model exists. A refusal is one line naming the fix (exit code 2), never a traceback.
"""
import argparse
import itertools
import math
import numbers
import os

from .config import full, quick
from .data import DataMissingError, ensure_data
from .validate import (
    BACKENDS,
    validate_backend,
    validate_global_batch,
    validate_lr,
    validate_output_path,
    validate_positive_int,
    validate_seed,
    validate_snapshot,
)

__all__ = ["script_parser", "resolve_args"]


def script_parser(doc, distributed=False):
    """The arguments single.py, spawn.py and torchrun.py share. Sizes default to None so that
    `resolve_args` can tell what the user typed from what --dry-run may fill in."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--epochs", type=int, default=None, help="epochs (default 10)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="GLOBAL batch, split evenly over the ranks (default 256)")
    p.add_argument("--lr", type=float, default=None, help="learning rate (default 0.2)")
    p.add_argument("--subset", type=int, default=None, help="first N training images (all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true",
                   help="CI size: fills in 2 epochs, 512 images, batch 64 where not given")
    who = "rank 0 " if distributed else ""
    p.add_argument("--save", default=None, help=f"{who}saves the model's state_dict here")
    p.add_argument("--metrics", default=None, help=f"{who}writes a JSON summary here")
    p.add_argument("--snapshot", default=None,
                   help="saved after every epoch (model, optimizer, epoch, RNGs); a run that\n"
                        "finds it continues from it")
    p.add_argument("--resume", action="store_true",
                   help="continue from --snapshot, which must exist")
    if distributed:
        p.add_argument("--backend", default=None, choices=BACKENDS,
                       help="default: nccl when every rank has a GPU, gloo otherwise")
        p.add_argument("--timeout", type=float, default=60,
                       help="seconds a collective may wait")
    return p


DEFAULTS = dict(epochs=10, batch_size=256, lr=0.2)
DRY_RUN = dict(epochs=2, batch_size=64, subset=512)


def resolve_args(args, world_size=1, local_world_size=1, parser=None):
    """Fill in what the user did not give (--dry-run sizes first, then the defaults) and check
    every argument, before any process group, data or model exists; an existing --snapshot is
    read and checked against the run (its ranks, its epochs, its lr); then Fashion-MNIST is
    made ready on disk (a data folder that cannot hold it is refused here, in one line). Errors
    go through `parser.error` (exit code 2, usage line) when a parser is given."""
    try:
        typed_lr = args.lr is not None
        filled = {}
        for k, v in {**DEFAULTS, **(DRY_RUN if args.dry_run else {})}.items():
            if getattr(args, k, None) is None and (args.dry_run or k in DEFAULTS):
                setattr(args, k, v)
                filled[k] = " (the --dry-run default)" if args.dry_run and k in DRY_RUN \
                    else " (the default)"
        validate_positive_int(args.epochs, "--epochs")
        validate_positive_int(args.subset, "--subset", allow_none=True)
        validate_lr(args.lr)
        validate_seed(args.seed, "--seed")
        validate_global_batch(args.batch_size, world_size, note=filled.get("batch_size", ""))
        if getattr(args, "backend", None) is not None:
            validate_backend(args.backend, local_world_size)
        timeout = getattr(args, "timeout", 1)
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"--timeout must be a finite number of seconds above 0, got "
                             f"{timeout}: e.g. --timeout 60")
        outputs = [(f"--{k}", getattr(args, k)) for k in ("save", "metrics", "snapshot")
                   if getattr(args, k)]
        for flag, path in outputs:
            validate_output_path(path, flag)
        for (f1, p1), (f2, p2) in itertools.combinations(outputs, 2):
            if os.path.realpath(p1) == os.path.realpath(p2):
                raise ValueError(f"{f1} and {f2} are the same file {p1}: each needs its own "
                                 f"(one would overwrite the other), e.g. {f1} a.pt {f2} b.pt")
        if args.resume and not (args.snapshot and os.path.exists(args.snapshot)):
            raise ValueError("--resume needs --snapshot PATH of an existing snapshot"
                             + (f" ({args.snapshot} does not exist)" if args.snapshot else ""))
        if args.snapshot and os.path.exists(args.snapshot):
            _validate_resume(args, world_size, typed_lr)
        quick(), full()           # an environment switch it does not know: refused here too
        try:
            ensure_data()         # on disk (downloaded if missing) before any rank starts
        except DataMissingError as e:
            raise ValueError(str(e)) from None
    except (TypeError, ValueError) as e:
        if parser is None:
            raise
        parser.error(str(e))
    return args


def _validate_resume(args, world_size, typed_lr):
    """What resuming from args.snapshot means for this run, decided and said before any work:
    a snapshot past --epochs is refused, a finished one trains nothing and keeps the outputs
    that run wrote, a typed --lr replaces the saved one (else the saved one goes on)."""
    say = print if os.environ.get("RANK", "0") == "0" else (lambda *a, **k: None)
    snap = validate_snapshot(args.snapshot, world_size)
    done, path = snap["epoch"], args.snapshot
    if done > args.epochs:
        raise ValueError(f"--snapshot {path} has already run {done} epochs, more than --epochs "
                         f"{args.epochs}: pass --epochs {done} or more to continue it, or delete "
                         "it (or give --snapshot another file) to start afresh")
    if done == args.epochs:
        say(f"--snapshot {path} already holds all {done} epochs: nothing left to train (pass "
            f"--epochs above {done} to train on)", flush=True)
        for k in ("save", "metrics"):
            if getattr(args, k) and os.path.exists(getattr(args, k)):
                say(f"--{k} {getattr(args, k)}: kept as the finished run wrote it", flush=True)
                setattr(args, k, None)
    saved_lr = snap["optimizer"]["param_groups"][0].get("lr")
    if not isinstance(saved_lr, numbers.Real):
        return
    if not typed_lr:
        args.lr = float(saved_lr)
    elif args.lr != saved_lr:
        say(f"--lr {args.lr:g} replaces the lr {saved_lr:g} saved in {path}", flush=True)
