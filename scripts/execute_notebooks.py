"""Execute notebooks in place (default: every notebook in _toc.yml), storing their outputs, and
record each run: how long it took, its peak memory and processes (book/_ext/runs.json).

Usage: python scripts/execute_notebooks.py [--no-store] [book/part2/scratch.ipynb ...]
(`make outputs`). Stores outputs at the CPU default size only: refuses COURSE_QUICK (the stored
outputs are what the published pages show, and what nbval compares on cells tagged
`nbval-check-output`). Stderr streams are dropped (warnings and progress bars are not part of
the lesson); a notebook with an error output in a cell not tagged `raises-exception` fails, is
left unchanged and records nothing. Written atomically.

Each run is recorded under the size it ran at (quick mode, the CPU default size, or the full size
on a GPU or with COURSE_FULL=1; book/_ext/chapter_runs.py): the seconds from the first cell's
start to the last cell's end (the cells' execution metadata, stored with the outputs), and,
sampled every SAMPLE_S seconds, the memory of the kernel and every process it started (ranks,
torchrun and its workers) together, as they would need it on a machine of their own (each one's
unique pages, the shared ones once: TreeSampler), the most processes alive at once, and the
machine's mean load average and the cores other processes kept busy meanwhile
(a run on a machine busy with other work is slower: the badge says so). --no-store records a run
without storing its outputs (any size, quick mode included: what Binder readers run).
"""
import argparse
import datetime
import os
import pathlib
import sys
import threading
import time

import nbformat
import psutil
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "book" / "_ext"))
sys.path.insert(0, str(ROOT))
import chapter_runs  # noqa: E402
from book_files import toc_notebooks  # noqa: E402

SAMPLE_S = 0.2   # the process list, CPU times and RSS: about a millisecond per sample
FULL_S = 1.0     # USS (the kernel walks every page: ~20 ms per GB per process) at most this often
SETUP_CELL = "course-setup"   # scripts/colab_setup_cell.py's CELL_ID: nothing to store
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _empty_display(o):
    """A display emptied after use (helpers.launch's progress line, cleared when the ranks end)."""
    return o.get("output_type") == "display_data" and \
        all(not v for v in o.get("data", {}).values())


def clean(nb):
    """Drop stderr streams and emptied displays; return the error outputs of cells not meant to
    raise, one line each."""
    errors = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        cell.outputs = [o for o in cell.get("outputs", [])
                        if not (o.get("output_type") == "stream" and o.get("name") == "stderr")
                        and not _empty_display(o)]
        if cell.get("id") == SETUP_CELL:   # stored as scripts/colab_setup_cell.py writes it
            cell.execution_count, cell.outputs = None, []
            cell.metadata.pop("execution", None)
            continue
        if "raises-exception" in cell.get("metadata", {}).get("tags", []):
            continue
        for o in cell.outputs:
            if o.get("output_type") == "error":
                errors.append(f"cell {i} ({cell.get('id', '?')}): {o.get('ename')}: "
                              f"{o.get('evalue', '')[:200]}")
    return errors


def drop_unshown_widget_state(nb):
    """Remove the stored widget state when every widget output also carries text/html, which the
    book shows instead (_config.yml prefers it): the state would only load the widget manager
    onto the page for nothing. A live kernel recreates the widgets when the cell runs."""
    views = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
             if WIDGET_VIEW in o.get("data", {})]
    if views and all("text/html" in o["data"] for o in views):
        nb.metadata.pop("widgets", None)
        return True
    return False


class TreeSampler(threading.Thread):
    """Samples a process and all its descendants: the largest memory they hold together and the
    most processes alive at once. The memory is what the tree would need on a machine of its
    own: each process's unique pages (USS), plus the pages it shares counted once (the largest
    RSS - USS among them: ranks of one Python share its libraries). PSS would split the shared
    pages with every other process that maps them, so a busy machine would shrink it; RSS counts
    the libraries once per process. Where USS is not reported: RSS, an overestimate.

    USS is read only when the tree's RSS reaches a new high, at most every `full_interval` s (a
    high in between is scaled by the last reading's USS+shared per RSS): reading it for a dozen
    processes every 0.2 s kept half a core busy, which slowed the very run it measured (and
    counted as other work). `cpu_s` is the sampler's own CPU time."""

    def __init__(self, pid, interval=SAMPLE_S, full_interval=FULL_S):
        super().__init__(daemon=True)
        self.root, self.interval, self.full_interval = psutil.Process(pid), interval, full_interval
        self.peak_bytes, self.processes, self.kind, self.loads = 0, 0, "USS+shared", []
        self.others, self._cpu, self._last = [], {}, None   # see _other_work
        self._rss_high, self._full_at, self._per_rss, self.cpu_s = 0, None, 1.0, 0.0
        self._done = threading.Event()

    def _other_work(self, procs):
        """Cores kept busy by processes outside the tree since the last sample: the machine's
        CPU time less the tree's. (The load average cannot tell: a run's own ranks raise it.)"""
        own = 0.0
        for proc in procs:
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            total = t.user + t.system
            own += total - self._cpu.get(proc.pid, 0.0)
            self._cpu[proc.pid] = total
        c = psutil.cpu_times()
        busy = sum(c) - c.idle - getattr(c, "iowait", 0.0)
        now = time.monotonic()
        if self._last is not None and now > self._last[0]:
            self.others.append(max(0.0, busy - self._last[1] - own) / (now - self._last[0]))
        self._last = (now, busy)

    def _memory(self, proc):
        """(unique, shared) bytes of one process."""
        if self.kind != "RSS":
            try:
                info = proc.memory_full_info()
                return info.uss, max(0, info.rss - info.uss)
            except (AttributeError, psutil.AccessDenied):
                self.kind = "RSS"
        return proc.memory_info().rss, 0

    def sample(self):
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:   # the kernel is gone
            return
        rss, alive = 0, 0
        for proc in procs:
            try:
                rss, alive = rss + proc.memory_info().rss, alive + 1
            except psutil.Error:   # ended between the listing and the reading
                continue
        self.processes = max(self.processes, alive)
        now = time.monotonic()
        if rss > self._rss_high and (self._full_at is None
                                     or now - self._full_at >= self.full_interval):
            self._rss_high, self._full_at = rss, now
            unique, shared = 0, 0
            for proc in procs:
                try:
                    u, s = self._memory(proc)
                except psutil.Error:
                    continue
                unique, shared = unique + u, max(shared, s)
            self.peak_bytes = max(self.peak_bytes, unique + shared)
            self._per_rss = (unique + shared) / rss if rss else 1.0
        elif rss > self._rss_high:   # a new high too soon for USS: scaled from the last reading
            self.peak_bytes = max(self.peak_bytes, int(rss * self._per_rss))
        self._other_work(procs)
        if hasattr(os, "getloadavg"):
            self.loads.append(os.getloadavg()[0])

    def other_cores(self):
        """Mean cores that other work kept busy during the run (None before two samples)."""
        return round(sum(self.others) / len(self.others), 2) if self.others else None

    def load(self):
        """The machine's mean load average over the run (None where the system has none)."""
        return round(sum(self.loads) / len(self.loads), 1) if self.loads else None

    def run(self):
        t0 = time.thread_time()
        while not self._done.is_set():
            self.sample()
            self.cpu_s = time.thread_time() - t0
            self._done.wait(self.interval)

    def stop(self):
        self._done.set()
        self.join()


def _stamp(cell, key):
    value = cell.get("metadata", {}).get("execution", {}).get(key)
    return datetime.datetime.fromisoformat(value) if value else None


def cells_seconds(nb):
    """Seconds from the first code cell's start to the last one's end, from the cells' execution
    metadata (nbclient's record_timing); None when no cell has it."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    starts = [s for s in (_stamp(c, "iopub.execute_input") for c in code) if s]
    ends = [e for e in (_stamp(c, "shell.execute_reply") for c in code) if e]
    if not starts or not ends:
        return None
    return (max(ends) - min(starts)).total_seconds()


def cpu_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def machine():
    """'2 CPU cores, no GPU' or '16 CPU cores, 2 x NVIDIA H100 80GB HBM3', and the GPU count."""
    import torch
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpu = f"{n} x {torch.cuda.get_device_name(0)}" if n else "no GPU"
    return f"{cpu_cores()} CPU cores, {gpu}", n


def run(path):
    """Execute `path`'s notebook; (the executed notebook, the run's record entry, errors)."""
    nb = nbformat.read(path, as_version=4)
    sampler = {}

    def start(**_):
        sampler["t"] = TreeSampler(client.km.provisioner.pid)
        sampler["t"].start()
        sampler["t0"] = time.monotonic()

    client = NotebookClient(nb, timeout=1800, kernel_name="python3", allow_errors=True,
                            on_notebook_start=start,
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    finally:
        if "t" in sampler:
            sampler["t"].stop()
    wall = time.monotonic() - sampler["t0"]
    errors = clean(nb)
    seconds = cells_seconds(nb)
    t = sampler["t"]
    entry = dict(seconds=round(seconds if seconds is not None else wall, 1),
                 peak_bytes=t.peak_bytes, processes=t.processes, memory=t.kind, load=t.load(),
                 others=t.other_cores())
    return nb, entry, errors


def docname(path):
    """'book/part1/costs' (the book's name of a page), or the file's stem outside the book."""
    path = path.resolve()
    return (path.relative_to(ROOT).with_suffix("").as_posix() if path.is_relative_to(ROOT)
            else path.stem)


def record_run(doc, mode, entry, path=None):
    """Write `entry` as `doc`'s run at `mode` into the record, atomically."""
    from helpers import write_json
    path = path or chapter_runs.RECORD
    record = chapter_runs.load(path)
    record.setdefault(doc, {})[mode] = entry
    write_json(path, {d: dict(sorted(m.items())) for d, m in sorted(record.items())})


def refresh_runs_line(nb, doc, mode, entry, record=None):
    """The run-time sentence after the notebook's "Runs on" line (chapter_runs.notebook_line:
    what a reader in Colab or JupyterLab sees of the badge), from the record with this run in it.
    A notebook without the line, its GPU count, or a run at the CPU default size is left as is."""
    runs = chapter_runs.load(record)
    runs.setdefault(doc, {})[mode] = entry
    gpus = (nb.metadata.get("course") or {}).get("gpus")
    if not isinstance(gpus, int) or chapter_runs.run_of(runs, doc, "small") is None:
        return
    for cell in nb.cells:
        if cell.cell_type == "markdown" and chapter_runs.RUNS_LINE.search(cell.source):
            cell.source = chapter_runs.with_notebook_line(cell.source, runs, doc, gpus)


def execute(path, store=True, record=None):
    """Run `path`, store its outputs (unless not `store`), record the run in `record`
    (default: book/_ext/runs.json)."""
    import torch
    path = pathlib.Path(path)
    where, num_gpus = machine()
    mode = chapter_runs.run_mode(os.environ, num_gpus)
    nb, entry, errors = run(path)
    if errors:
        raise SystemExit(f"{path}: stored outputs not updated, errors:\n  " + "\n  ".join(errors))
    entry.update(machine=where, cores=cpu_cores(), date=datetime.date.today().isoformat(),
                 torch=torch.__version__.split("+")[0], stored=store)
    if store:
        drop_unshown_widget_state(nb)
        refresh_runs_line(nb, docname(path), mode, entry, record)
        from helpers import atomic_write  # the one atomic writer: a kill keeps the old file
        atomic_write(path, lambda f: nbformat.write(nb, f), mode="w")
    record_run(docname(path), mode, entry, record)
    from helpers import plural
    print(f"executed {path} ({chapter_runs.MODES[mode]}): {chapter_runs.run_text(entry)}, "
          f"{chapter_runs.fmt_bytes(entry['peak_bytes'])}, {plural(entry['processes'], 'process')} "
          "at once"
          + ("" if store else "; outputs not stored"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=pathlib.Path)
    ap.add_argument("--no-store", action="store_true",
                    help="record the run only; leave the notebook's stored outputs as they are")
    ap.add_argument("--record", type=pathlib.Path, default=None,
                    help="the record to write (default book/_ext/runs.json)")
    args = ap.parse_args(argv)
    # A claim the run contradicts stops it (helpers.prose.claim): no page is stored whose text
    # says the opposite of its numbers. The kernels inherit it.
    os.environ["COURSE_CLAIMS"] = "strict"
    if not args.no_store and chapter_runs.run_mode(os.environ, 0) == "quick":
        raise SystemExit("COURSE_QUICK is set: stored outputs come from the CPU default size. "
                         "Unset it (`make outputs` does), or record a quick run with --no-store.")
    for path in args.notebooks or toc_notebooks():
        execute(path, store=not args.no_store, record=args.record)


if __name__ == "__main__":
    main()
