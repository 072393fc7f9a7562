"""Every pytest run in this repository: what it starts (notebook kernels, ranks, torchrun, the
scripts) keeps its temporary files in one folder, removed when the run ends. nbval stops each
kernel with SIGKILL, which skips what the kernel would remove at exit (the fork server's pymp-*
socket folder, a TemporaryDirectory a cell still holds): without this they pile up in /tmp.
With --scope-times FILE (make test-py): each test module's and notebook's worker, wall and CPU."""
import glob
import json
import os
import shutil
import tempfile
import time

import pytest

_MADE = "COURSE_TEST_TMPDIR"   # set: an outer run (or the xdist controller) made the folder


def pytest_configure(config):
    if os.environ.get(_MADE):
        return
    tempfile.gettempdir()   # this process keeps its own (pytest's tmp_path stays where it was)
    path = tempfile.mkdtemp(prefix="course-tests-")
    config._course_tmpdir = path, os.environ.get("TMPDIR")
    os.environ[_MADE] = os.environ["TMPDIR"] = path   # inherited by all it starts


def pytest_unconfigure(config):
    made = getattr(config, "_course_tmpdir", None)
    if made:
        path, before = made
        shutil.rmtree(path, ignore_errors=True)
        os.environ.pop(_MADE)
        if before is None:
            os.environ.pop("TMPDIR")
        else:
            os.environ["TMPDIR"] = before


# ---- --scope-times FILE: where a run's time goes, unit by unit (make test-py writes it) ----------
# xdist's loadscope gives each worker whole units (a test module, a notebook). For each, its worker,
# start, end and CPU (the worker and every live process under it, with what they reaped: ranks,
# kernels, torchrun) go to FILE; the summary names the units that cost most and how long each
# worker sat idle at the end (a long unit started last).
def pytest_addoption(parser):
    parser.addoption("--scope-times", default=None, metavar="FILE",
                     help="write each test module's and notebook's worker, wall and CPU to FILE")


def _tree_cpu():
    """CPU seconds of this process and its live descendants, each with its reaped children's."""
    stats = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        stats[int(name)] = int(fields[1]), sum(int(x) for x in fields[11:15])
    children = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0))[1]
        todo += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


def _unit(item):
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A unit starts with its first test's set-up and ends with its last test's teardown (its
    module's fixtures too)."""
    if not item.config.getoption("--scope-times") or not os.path.isdir("/proc"):
        yield
        return
    rows = item.config.__dict__.setdefault("_scope_rows", [])
    if not rows or rows[-1]["end"] is not None or rows[-1]["unit"] != _unit(item):
        rows.append(dict(unit=_unit(item), worker=os.environ.get("PYTEST_XDIST_WORKER", "main"),
                         start=time.time(), cpu=_tree_cpu(), tests=0, end=None))
    rows[-1]["tests"] += 1
    yield
    if nextitem is None or _unit(nextitem) != _unit(item):
        rows[-1]["end"], rows[-1]["cpu"] = time.time(), round(_tree_cpu() - rows[-1]["cpu"], 1)


def pytest_sessionfinish(session):
    path = session.config.getoption("--scope-times")
    rows = session.config.__dict__.get("_scope_rows")
    if path and rows:   # each worker (or the one process) its own file, merged at the summary
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(f"{path}.{worker}", "w") as f:
            json.dump(rows, f)


def pytest_terminal_summary(terminalreporter, config):
    path = config.getoption("--scope-times")
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rows = []
    for part in sorted(glob.glob(glob.escape(path) + ".*")):
        with open(part) as f:
            rows += json.load(f)
        os.remove(part)
    rows = [r for r in rows if r["end"] is not None]
    if not rows:
        return
    t0 = min(r["start"] for r in rows)
    for r in rows:
        r["start"], r["end"] = round(r["start"] - t0, 1), round(r["end"] - t0, 1)
        r["wall"] = round(r["end"] - r["start"], 1)
    rows.sort(key=lambda r: r["start"])
    with open(path, "w") as f:   # a JSON list, one unit a line
        f.write("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n")
    write = terminalreporter.write_line
    write(f"---- {len(rows)} units (modules, notebooks): the most CPU first (all in {path})")
    for r in sorted(rows, key=lambda r: -r["cpu"])[:25]:
        write(f"{r['cpu']:7.1f} s CPU {r['wall']:6.1f} s wall  {r['worker']:>4} "
              f"{r['start']:6.0f}-{r['end']:<6.0f} {r['unit']}")
    end = max(r["end"] for r in rows)
    for worker in sorted({r["worker"] for r in rows}):
        mine = [r for r in rows if r["worker"] == worker]
        last = mine[-1]
        write(f"{worker}: {len(mine)} units, {sum(r['cpu'] for r in mine):.0f} s CPU, "
              f"idle for the last {end - last['end']:.0f} s; its last: {last['unit']} "
              f"({last['start']:.0f}-{last['end']:.0f} s)")
