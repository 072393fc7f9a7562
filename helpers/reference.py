"""Part IV: the committed GPU reference run (reference/gpu_reference.json), shown beside the
reader's own figures. `scripts/gpu_runner.sh` writes it on a GPU machine; until one has run, the
file says that no GPU run exists and the chapters say so.
"""
import datetime
import os
import platform

from .paths import course_file
from .runtime.files import read_json, write_json

__all__ = ["REFERENCE_PATH", "gpu_reference", "describe_gpu_reference", "write_gpu_reference"]

REFERENCE_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "reference", "gpu_reference.json")


def _committed_reference():
    """The checkout's file, else the copy a plain install ships (helpers/_reference/)."""
    try:
        return str(course_file("gpu_reference.json"))
    except FileNotFoundError:
        return REFERENCE_PATH


def gpu_reference(path=None):
    """The reference run as a dict; {'exists': False, ...} when no GPU run has been recorded (or
    the file is missing)."""
    path = path or _committed_reference()
    if not os.path.exists(path):
        return {"exists": False, "note": f"no reference file at {path}"}
    ref = read_json(path)
    if ref.get("exists") and not all(ref.get(k) for k in ("gpu", "torch", "date", "command")):
        raise ValueError(f"{path} claims a GPU run but does not name its GPU, torch version, "
                         "date and command: rewrite it with scripts/gpu_runner.sh")
    return ref


def describe_gpu_reference(path=None):
    """One line for a chapter: where the committed GPU figures come from, or that there are none,
    then the benchmark's rows (s/epoch, test accuracy) and ratios when a run exists."""
    ref = gpu_reference(path)
    if not ref.get("exists"):
        return ("GPU reference run: none exists yet (reference/gpu_reference.json says so); "
                "every figure on this page is from this machine.")
    head = (f"GPU reference run (not this machine): {ref['gpu']}, torch {ref['torch']}, "
            f"CUDA {ref.get('cuda')}, {ref['date']}, command `{ref['command']}`")
    bench = ref.get("bench") or {}
    rows = [f"  {r['trainer']} ({r['devices']} rank(s)/device(s)): {r['sec_per_epoch']:.3f} "
            f"s/epoch, test acc {r['test_acc']:.3f}" for r in bench.get("rows", [])]
    ratios = [f"  {k}: {v:.2f}" for k, v in bench.get("ratios", {}).items()]
    return "\n".join([head] + rows + ratios)


def write_gpu_reference(bench_json, command, logs=None, path=None):
    """Record a GPU run: the benchmark's JSON, the GPU, versions, date and command, and the tails
    of the test logs (a dict name -> text). Written atomically."""
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("write_gpu_reference records GPU runs only: no GPU is visible here")
    bench = read_json(bench_json)
    ref = {"exists": True, "gpu": torch.cuda.get_device_name(0),
           "gpu_count": torch.cuda.device_count(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "python": platform.python_version(),
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "command": command, "bench": bench, "logs": logs or {}}
    write_json(path or REFERENCE_PATH, ref, indent=2)
    return ref
