"""Part IV: the committed GPU reference run (reference/gpu_reference.json), shown beside the
reader's own figures. `scripts/gpu_runner.sh` writes it on a GPU machine; until one has run, the
file says that no GPU run exists and the chapters say so.

The runner's steps each leave their results in one folder (env.json: the machine, captured on
the GPU; unit.xml, nbval.json: the test results; bench.json: the benchmark), so the steps can run
in separate sessions; `record` gathers them into the reference file and names what did not run.
    python -c "import helpers; helpers.gpu_runner_cli()" env OUTDIR [--dry-run]
    python -c "import helpers; helpers.gpu_runner_cli()" record OUTDIR COMMAND [--dry-run]
    python -c "import helpers; helpers.gpu_runner_cli()" nbval OUTDIR NOTEBOOK JUNIT SECONDS
"""
import datetime
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET

from .paths import course_file
from .runtime.files import read_json, write_json

__all__ = ["REFERENCE_PATH", "gpu_reference", "describe_gpu_reference", "write_gpu_reference",
           "gpu_figures", "one_gpu_step", "add_notebook", "add_gpu_path",
           "gpu_runner_cli", "failed_cells_words", "failed_cells_note"]

REFERENCE_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "reference", "gpu_reference.json")
STEPS = ("unit", "nbval", "bench")
RESULTS = ("status", "sweep", "paths")   # the runner's other files, gathered as they are


def _committed_reference():
    """The checkout's file, else the copy a plain install ships (helpers/_reference/)."""
    try:
        return str(course_file("gpu_reference.json"))
    except FileNotFoundError:
        return REFERENCE_PATH


def gpu_reference(path=None):
    """The reference run as a dict; {'exists': False, ...} when no GPU run has been recorded (or
    the file is missing, e.g. in a pip install without the repository, or is a dry run)."""
    path = path or _committed_reference()
    if not os.path.exists(path):
        return {"exists": False, "note": f"no reference file at {path}"}
    ref = read_json(path)
    if ref.get("dry_run"):
        return {"exists": False, "note": f"{path} is a dry run on a CPU, not a GPU run"}
    if ref.get("exists") and not all(ref.get(k) for k in ("gpu", "torch", "date", "command")):
        raise ValueError(f"{path} claims a GPU run but does not name its GPU, torch version, "
                         "date and command: rewrite it with scripts/gpu_runner.sh")
    return ref


def _honest_ratio(v):
    """A stored ratio with its verdict recomputed from its samples (helpers.timing.verdict_of):
    a run with one round stored "faster"/"slower" from a single sample; that is "cannot tell"."""
    from .timing import verdict_of
    samples = v.get("samples") or [v["median"]]
    return dict(v, verdict=verdict_of(samples), rounds=len(samples))


def _rounds_note(bench):
    n = bench.get("rounds", 1)
    if n >= 2:
        return f"  ({n} rounds each; ratios with their spread over the rounds)"
    return ("  (one round: each figure is a single reading and no ratio has a spread, so none "
            "says faster or slower: cannot tell)")


def _scope(ref, bench):
    """What the run can stand for: how many GPUs it had (more is a prediction), what its
    multi-device rows are, and whether its ratios have a spread."""
    gpus = ref.get("gpu_count") or 1
    rows = bench.get("rows", [])
    shared = sorted({r["n"] for r in rows if r["where"] == "process" and r["n"] > gpus})
    ranks = sorted({r["n"] for r in rows if r["where"] == "ranks"})
    words = [f"it had {'one GPU' if gpus == 1 else f'{gpus} GPUs'}, so anything about "
             f"{'two' if gpus == 1 else gpus + 1} or more GPUs is still a prediction"]
    if shared:
        words.append(f"its {' and '.join(map(str, shared))}-device rows are simulated devices "
                     f"sharing {'that GPU' if gpus == 1 else 'its GPUs'}")
    if ranks:
        many = len(ranks) > 1 or any(n != 1 for n in ranks)
        words.append(f"its rank rows ran {' and '.join(map(str, ranks))} NCCL "
                     f"rank{'s' if many else ''}")
    words.append("one round, so its ratios have no spread" if bench.get("rounds", 1) < 2 else
                 f"{bench['rounds']} rounds")
    return "; ".join(words)


def describe_gpu_reference(path=None):
    """A few lines for a chapter: where the committed GPU figures come from, or that there are
    none; then the benchmark's rows (s/epoch, test accuracy) and ratios when a run exists, each
    ratio's verdict recomputed from its rounds (one round: cannot tell)."""
    ref = gpu_reference(path)
    if not ref.get("exists"):
        return ("GPU reference run: none exists yet (reference/gpu_reference.json says so); "
                "every figure on this page is from this machine.")
    gpus = ref.get("gpu_count")
    head = (f"GPU reference run (not this machine): {ref['gpu']}"
            + (f" x{gpus}" if gpus else "") + f", torch {ref['torch']}, "
            f"CUDA {ref.get('cuda')}, {ref['date']}, commit {ref.get('commit', 'unknown')}, "
            f"command `{ref['command']}`")
    bench = ref.get("bench") or {}

    def where(r):
        if r["where"] == "ranks":
            return f"{r['n']} rank{'s' if r['n'] != 1 else ''}"
        shared = gpus and r["n"] > gpus
        return (f"{r['n']} device{'s' if r['n'] != 1 else ''}"
                + (f" sharing {gpus} GPU{'s' if gpus != 1 else ''}" if shared else ""))
    rows = [f"  {r['trainer']} ({where(r)}): {r['sec_per_epoch']['median']:.3f} s/epoch, test "
            f"acc {r['test_acc']['median']:.3f}" for r in bench.get("rows", [])]
    ratios = [f"  {k}: {v['median']:.2f}x ({v['verdict']})" for k, v in
              ((k, _honest_ratio(v)) for k, v in bench.get("ratios", {}).items())]
    note = [_rounds_note(bench), f"  ({_scope(ref, bench)})"] if bench else []
    accs = [r["test_acc"]["median"] for r in bench.get("rows", [])]
    if accs and max(accs) < 0.3:   # 10 classes: 0.1 is chance
        note.append("  (every test accuracy is near chance: too few steps for the "
                    "0.01-initialised LeNet to leave its plateau, so they say nothing about "
                    "the trainers)")
    missing = [s for s in STEPS if s not in ref.get("steps", {})]
    tail = [f"  steps not run: {', '.join(missing)}"] if missing else []
    failed = ref.get("steps", {}).get("nbval", {}).get("failed", [])
    if failed:
        tail.append(f"  cells that failed under nbval in that run (numbered as at commit "
                    f"{ref.get('commit', 'unknown')}): {', '.join(failed)}")
    return "\n".join([head] + rows + note + ratios + tail)


def gpu_figures(path=None):
    """What a chapter cites from the committed GPU run: {"gpu", "gpu_count", "date", "rounds",
    "scope": what the run can stand for (its GPU count: more is a prediction; its shared-device
    and rank rows; its rounds),
    "sec_per_epoch": {row name: median s/epoch}, "ratios": {ratio name: {median, spread,
    verdict, rounds}} (verdicts from the spread: "cannot tell" from one round), "sentence":
    where the figures come from}; None when no GPU run exists (then the chapter's GPU claims are
    predictions, and it says so)."""
    ref = gpu_reference(path)
    if not ref.get("exists") or not ref.get("bench"):
        return None
    bench = ref["bench"]
    rounds = bench.get("rounds", 1)
    return dict(gpu=ref["gpu"], gpu_count=ref.get("gpu_count"), date=ref["date"],
                rounds=rounds, scope=_scope(ref, bench),
                sec_per_epoch={r["name"]: r["sec_per_epoch"]["median"] for r in bench["rows"]},
                ratios={k: _honest_ratio(v) for k, v in bench.get("ratios", {}).items()},
                sentence=f"the committed GPU reference run ({ref['gpu']}"
                         + (f" x{ref['gpu_count']}" if ref.get("gpu_count") else "")
                         + f", torch {ref['torch']}, {ref['date']}, "
                         + ("one round" if rounds < 2 else f"{rounds} rounds")
                         + "; reference/gpu_reference.json)")


def one_gpu_step(path=None):
    """The GPU reference run's fastest measured LeNet step on one GPU, for the chapters that set
    a model beside it: dict(seconds: a training step, the row's median s/epoch over the epoch's
    steps; row: its name; note: how it ran, e.g. "CUDA graph"; batch, steps_per_epoch, gpu,
    date); None when no GPU run has measured one (then the model's figure stands alone)."""
    ref = gpu_reference(path)
    bench = ref.get("bench") if ref.get("exists") else None
    rows = [r for r in (bench or {}).get("rows", []) if r["n"] == 1 and r["where"] == "process"]
    if not rows:
        return None
    batch = bench["batch_size"]
    steps = -(-(bench["size"].get("subset") or 60000) // batch)   # the loader's last batch
    best = min(rows, key=lambda r: r["sec_per_epoch"]["median"])
    return dict(seconds=best["sec_per_epoch"]["median"] / steps, row=best["name"],
                note=best.get("note", ""), batch=batch, steps_per_epoch=steps,
                gpu=ref["gpu"], date=ref["date"])


def failed_cells_words(notebook, path=None, names=None, who="That run also"):
    """What the committed GPU run's nbval step recorded for `notebook` (its path in the
    repository, e.g. "book/part4/fixes.ipynb"): "" where none of its cells failed there (or no
    GPU run, or it was not run), else a sentence (after a space) naming the failed cells. The
    file records which cells failed, not why: so does the sentence. `names`, {commit: {nbval
    cell number: words}}, says what a failed cell held at the run's commit (a number means
    nothing to a reader): every failed cell named, by content only; some, by number and then
    what those held. `who` opens the sentence, naming the run as the text before it does."""
    cells, commit = _failed_cells(notebook, path)
    if not cells:
        return ""
    known = next((v for k, v in (names or {}).items() if str(commit).startswith(k)), {})
    head = (f" {who} executed this notebook's code cells on its GPU (nbval), and "
            f"{len(cells)} of them failed there")
    them = ("them, what those cells compute is" if len(cells) > 1
            else "it, what that cell computes is")
    tail = ("reference/gpu_reference.json records which cells failed, not why): until a GPU "
            f"run passes {them} not checked on a GPU.")
    if all(c in known for c in cells):
        said = [known[c] for c in cells]
        listed = "; ".join(said[:-1]) + ("; and " if len(said) > 1 else "") + said[-1]
        return f"{head}: {listed} (in the notebook at commit {commit}; {tail}"
    # nbval numbers the code cells only, from 0: "Cell 22" is the 23rd code cell
    nth = [_ordinal(c + 1) for c in cells]
    named = ", ".join(nth[:-1]) + (" and " if len(nth) > 1 else "") + nth[-1]
    word = "cells" if len(cells) > 1 else "cell"
    return (f"{head} (the {named} code {word} of the notebook at commit {commit}, counting "
            f"code cells only; {tail}"
            + "".join(f" At that commit the {_ordinal(c + 1)} code cell was {known[c]}."
                      for c in cells if c in known))


def _failed_cells(notebook, path=None):
    """(the nbval numbers of `notebook`'s cells that failed in the committed GPU run, sorted;
    the run's commit)."""
    ref = gpu_reference(path)
    nbval = ref.get("steps", {}).get("nbval", {}) if ref.get("exists") else {}
    prefix = notebook.replace("/", ".").replace(".ipynb", "") + ".ipynb::Cell "
    cells = sorted(int(f[len(prefix):]) for f in nbval.get("failed", [])
                   if f.startswith(prefix) and f[len(prefix):].isdigit())
    return cells, ref.get("commit", "unknown")


def failed_cells_note(notebook, path=None, names=None):
    """A short note (after a space) for the reader where the committed GPU run's nbval step
    failed cells of `notebook`: "" where none failed. `names` as failed_cells_words' ({commit:
    {nbval cell number: what it checks}}), used only for the run's commit; a value may be a
    tuple (what, then, now) for a cell changed since the run: what the failed version did and
    what this one does. No commit or cell number reaches the reader."""
    cells, commit = _failed_cells(notebook, path)
    if not cells:
        return ""
    known = next((v for k, v in (names or {}).items() if str(commit).startswith(k)), {})
    ref = gpu_reference(path)
    run = f"The GPU reference run ({ref.get('gpu')}, {ref.get('date')})"
    why = ("it stopped with an error or a check of the text that did not hold; the run stores "
           "which cells failed, not why, nor the figures they print")
    if all(c in known for c in cells):
        said = [known[c] for c in cells]
        if len(said) == 1 and isinstance(said[0], tuple):
            what, then, now = said[0]
            return (f" {run} executed an earlier version of {what}, which {then}, and that cell "
                    f"failed there ({why}). This version {now}, and no GPU run has recorded it "
                    "yet: what this section says a GPU shows is a prediction.")
        said = [s[0] if isinstance(s, tuple) else s for s in said]
        cell = "the cells" if len(said) > 1 else "the cell"
        return (f" {run} executed this chapter, and {cell} of {' and '.join(said)} failed there "
                f"({why}): what the chapter says a GPU shows there is a prediction until a GPU "
                "run records it.")
    one = len(cells) == 1
    return (f" {run} executed this chapter, and {'one' if one else len(cells)} of its cells "
            f"failed there ({why}): what the chapter says a GPU shows is a prediction until a "
            "GPU run records it.")


def _ordinal(n):
    """'1st', '2nd', '3rd', '23rd', '11th'."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _capture_env(path, dry_run=False):
    """Write what the reference file says about the machine (GPU, versions, date) to `path`:
    called on the GPU machine itself, so that `record` can run anywhere later."""
    import torch
    gpu = torch.cuda.is_available()
    if not gpu and not dry_run:
        raise SystemExit("gpu_runner: no GPU visible here: this records GPU runs only "
                         "(--dry-run exercises the steps on a CPU)")
    env = {"gpu": torch.cuda.get_device_name(0) if gpu else "none (dry run)",
           "gpu_count": torch.cuda.device_count() if gpu else 0,
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if gpu else None,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())) if gpu else None,
           "python": platform.python_version(), "platform": platform.platform(),
           "cpus": os.cpu_count(), "commit": _commit(),
           "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")}
    write_json(path, env)
    print(f"gpu_runner: {env['gpu']} (x{env['gpu_count']}), torch {env['torch']}, CUDA "
          f"{env['cuda']}, Python {env['python']}, commit {env['commit']}")
    return env


def _commit():
    if os.environ.get("COURSE_COMMIT"):
        return os.environ["COURSE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _junit(path):
    """Counts and the failing test names of a pytest --junitxml file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors",
                                                                  "skipped")}
    failed = [f"{c.get('classname')}::{c.get('name')}" for s in suites for c in s
              if c.find("failure") is not None or c.find("error") is not None]
    return dict(counts, passed=counts["tests"] - counts["failures"] - counts["errors"]
                - counts["skipped"], failed=failed)


def add_notebook(outdir, notebook, junit=None, seconds=None):
    """Record one notebook's nbval result (a junit file; None: the budget left it out) in
    outdir/nbval.json, keeping the others' (a later session adds to an earlier one's)."""
    path = os.path.join(outdir, "nbval.json")
    per = read_json(path) if os.path.exists(path) else {}
    per[notebook] = (dict(_junit(junit), ran=True, seconds=seconds) if junit and
                     os.path.exists(junit) else per.get(notebook, {"ran": False}))
    write_json(path, per)
    v = per[notebook]
    print(f"gpu_runner: nbval {notebook}: " + (f"{v['passed']} passed, {v['failures']} failed, "
                                               f"{v['errors']} errors, {seconds} s"
                                               if v.get("ran") else "not run (budget)"))


def add_gpu_path(outdir, step, result):
    """Record what one of the runner's GPU-path steps (train, torchrun, comm, cp, memory; gpus)
    found, in outdir/paths.json, keeping the other steps' (one file: the device returns few)."""
    path = os.path.join(outdir, "paths.json")
    got = read_json(path) if os.path.exists(path) else {}
    got[step] = result
    write_json(path, got)


def write_gpu_reference(outdir, command, path=None, dry_run=False):
    """Gather the runner's results in `outdir` into the reference file (atomically) and return
    it. A dry run (a CPU exercising the steps) is marked so and never written over the committed
    file; a real one needs env.json captured on a GPU."""
    env_path = os.path.join(outdir, "env.json")
    if not os.path.exists(env_path):
        raise FileNotFoundError(f"{env_path} is missing: run a step of scripts/gpu_runner.sh "
                                "on the GPU machine first (each step captures it)")
    env = read_json(env_path)
    if not dry_run and not env.get("gpu_count"):
        raise RuntimeError(f"{env_path} was captured without a GPU: only a GPU run is recorded")
    path = path or (os.path.join(outdir, "gpu_reference.json") if dry_run else REFERENCE_PATH)
    if dry_run and os.path.abspath(path) == os.path.abspath(REFERENCE_PATH):
        raise ValueError("a dry run must not overwrite the committed reference file")
    steps = {}
    if os.path.exists(os.path.join(outdir, "unit.xml")):
        steps["unit"] = _junit(os.path.join(outdir, "unit.xml"))
    if os.path.exists(os.path.join(outdir, "nbval.json")):
        per = read_json(os.path.join(outdir, "nbval.json"))
        ran = {nb: v for nb, v in per.items() if v.get("ran", True)}
        steps["nbval"] = {k: sum(v[k] for v in ran.values())
                          for k in ("tests", "failures", "errors", "skipped", "passed")}
        steps["nbval"]["failed"] = sum((v["failed"] for v in ran.values()), [])
        steps["nbval"]["notebooks"] = {nb: "failed" if v["failures"] or v["errors"] else "passed"
                                       for nb, v in ran.items()}
        steps["nbval"]["not_run"] = sorted(nb for nb in per if nb not in ran)
    bench = None
    if os.path.exists(os.path.join(outdir, "bench.json")):
        bench = read_json(os.path.join(outdir, "bench.json"))
        steps["bench"] = {"targets": bench.get("targets")}
    more = {k: read_json(os.path.join(outdir, f"{k}.json")) for k in RESULTS
            if os.path.exists(os.path.join(outdir, f"{k}.json"))}
    rates = (more.get("paths") or {}).get("comm", {}).get("rates")
    # what the emulated lessons model (runtime.emulate.Rates.load assumes the parts not measured)
    ref = dict(env, exists=True, dry_run=dry_run, command=command, steps=steps, bench=bench,
               **more, **({"rates": rates} if rates else {}),
               not_run=[s for s in STEPS if s not in steps],
               recorded=datetime.datetime.now(datetime.UTC).strftime(
                   "%Y-%m-%d %H:%M UTC"))
    write_json(path, ref)
    copy = os.path.join(outdir, "gpu_reference.json")
    if os.path.abspath(copy) != os.path.abspath(path):   # a copy that travels back with outdir
        write_json(copy, ref)
    return ref


def gpu_runner_cli(argv=None):
    """The runner's command line: env OUTDIR [--dry-run] | record OUTDIR COMMAND [--dry-run]."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or argv[0] not in ("env", "record", "nbval") \
            or argv[0] in ("record", "nbval") and len(argv) < 3:
        raise SystemExit("usage: gpu_runner_cli() with env OUTDIR [--dry-run] | record OUTDIR "
                         "COMMAND [--dry-run] | nbval OUTDIR NOTEBOOK (JUNIT SECONDS | --not-run); "
                         f"got {argv}")
    what, outdir, dry = argv[0], argv[1], "--dry-run" in argv
    if what == "nbval":
        ran = "--not-run" not in argv and len(argv) >= 5
        add_notebook(outdir, argv[2], argv[3] if ran else None, int(argv[4]) if ran else None)
    elif what == "env":
        _capture_env(os.path.join(outdir, "env.json"), dry_run=dry)
    elif what == "record":
        ref = write_gpu_reference(outdir, argv[2], dry_run=dry)
        print(f"gpu_runner: wrote {os.path.join(outdir, 'gpu_reference.json')}"
              + ("" if dry else f" and {REFERENCE_PATH}"))
        for s, v in ref["steps"].items():
            if s == "bench":
                got = [f"{t['target']}: {'met' if t['met'] else 'NOT met'}"
                       + ("" if t.get("rounds", 2) >= 2 else " (one round, no spread)")
                       for t in (v.get("targets") or {}).get("verdicts", [])]
            else:
                got = {k: v[k] for k in ("passed", "failures", "errors", "skipped")}
            print(f"gpu_runner: {s}: {got}")
        print(f"gpu_runner: recorded {ref['gpu']}, {ref['date']}; not run: "
              f"{', '.join(ref['not_run']) or 'none'}")
