"""The chapters' measured runs (book/_ext/runs.json): how `make outputs` records them
(scripts/execute_notebooks.py), and the badges and landing-page table built from them
(book/_ext/chapter_runs.py, course_badges.py). The built pages: tests/browser/test_badges.py."""
import importlib.util
import json
import subprocess
import sys
import textwrap
import time

import nbformat
import pytest
from book_files import ROOT, toc_notebooks

EXT = ROOT / "book" / "_ext"
sys.path.insert(0, str(EXT))
import chapter_runs  # noqa: E402


def _executor():
    spec = importlib.util.spec_from_file_location("execute_notebooks",
                                                  ROOT / "scripts" / "execute_notebooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(seconds, peak_mib=100, processes=1, date="2026-12-01", machine="2 CPU cores, no GPU"):
    return dict(seconds=seconds, peak_bytes=peak_mib * 2 ** 20, processes=processes,
                machine=machine, date=date, memory="USS+shared", torch="2.14.1", stored=True)


RECORD = {"book/a": {"small": _run(45.0, 1500, 3), "full": _run(301.0, machine="1 x H100")},
          "book/b": {"small": _run(4.4), "quick": _run(2.0)}}


# ---------------------------------------------------------------- what the pages say
def test_badge_says_the_recorded_times_and_needs():
    times, needs = chapter_runs.badge_text(RECORD, "book/a", 2)
    assert times == ("CPU default size 45 s (2 CPU cores, no GPU, 2026-12-01); "
                     "full size 5 min 01 s (1 x H100, 2026-12-01)")
    assert needs.startswith("1.5 GiB of memory at most, 3 processes at once; asks for 2 GPUs")
    times, needs = chapter_runs.badge_text(RECORD, "book/b", 0)
    assert "quick mode 2 s" in times and times.endswith("full size not measured yet")
    assert needs == "100 MiB of memory at most, 1 process at once; no GPU"


def test_a_quick_run_timed_slower_than_the_default_size_shows_no_time():
    """Quick mode does less than the default size: a quick run recorded on a busier machine
    that took longer would tell the reader the opposite, so its time is not shown."""
    record = {"book/a": {"small": _run(45.0), "quick": dict(_run(60.0), load=14.0, cores=2)}}
    times, _ = chapter_runs.badge_text(record, "book/a", 0)
    assert "quick mode shorter" in times and "1 min" not in times


def test_table_rows_come_from_the_record():
    rows = chapter_runs.table_rows(RECORD, [("book/a", "A", 2), ("book/b", "B", 0)])
    assert rows == [("A", "45 s", "1.5 GiB", "3", "2 GPUs", "5 min 01 s"),
                    ("B", "4 s", "100 MiB", "1", "none", "not measured yet")]
    assert chapter_runs.table_head(RECORD, ["book/a", "book/b"])[-1] == "full size"


def test_no_full_size_column_until_a_full_size_run_exists():
    """Said once under the table, not "not measured yet" in every row."""
    record = {"book/a": {"small": _run(45.0, 1500, 3)}, "book/b": {"small": _run(4.4)}}
    rows = chapter_runs.table_rows(record, [("book/a", "A", 2), ("book/b", "B", 0)])
    assert rows == [("A", "45 s", "1.5 GiB", "3", "2 GPUs"), ("B", "4 s", "100 MiB", "1", "none")]
    assert chapter_runs.table_head(record, ["book/a", "book/b"]) == chapter_runs.TABLE_HEAD
    assert "full size" not in chapter_runs.TABLE_HEAD


def test_the_notebook_line_says_the_cpu_run_and_needs():
    line = chapter_runs.notebook_line(RECORD, "book/a", 2)
    assert line == ("Run time: CPU default size 45 s (2 CPU cores, no GPU, 2026-12-01). Needs: "
                    + chapter_runs.needs_text(RECORD["book/a"]["small"], 2) + ".")
    import course_badges as badges
    assert badges.places_of_line(f"Runs on: CPU, several GPUs. {line}") == ["cpu", "gpus"]
    assert badges.places_of_line("Runs on: CPU, several GPUs.") == ["cpu", "gpus"]
    assert badges.places_of_line("Runs on: a toaster. Run time: 1 s.") is None


def test_binder_is_offered_only_where_the_quick_run_fits():
    big = dict(_run(19.0), peak_bytes=int(2.1 * 2 ** 30))
    record = {"book/a": {"small": _run(45.0), "quick": _run(2.0, 900)},
              "book/b": {"small": _run(45.0), "quick": big}, "book/c": {"small": _run(4.0)}}
    assert [chapter_runs.fits_binder(record, d) for d in ("book/a", "book/b", "book/c")] == \
        [True, False, False]
    assert chapter_runs.binder_text(record, "book/a") == "fits (quick mode, 900 MiB at most)"
    assert "needs 2.1 GiB, more than Binder's 1.5 GiB" in chapter_runs.binder_text(record,
                                                                                  "book/b")
    assert "no quick-mode run" in chapter_runs.binder_text(record, "book/c")
    assert chapter_runs.machines(RECORD, ["book/a", "book/b"]) == \
        ("2 CPU cores, no GPU", "2026-12-01")


def test_a_run_on_a_busy_machine_says_so():
    busy = dict(_run(90.0), load=13.4, cores=2)
    record = {"book/a": {"small": busy}, "book/b": {"small": dict(_run(9.0), load=0.8, cores=2)}}
    times, _ = chapter_runs.badge_text(record, "book/a", 1)
    assert "busy machine: load 13.4" in times
    # the run's own ranks raise the load average: other work's cores decide where measured
    own = dict(_run(9.0), load=8.5, cores=2, processes=8, others=0.1)
    assert not chapter_runs.busy(own) and not chapter_runs.busy(dict(own, others=None))
    shared = dict(own, others=1.4)
    assert chapter_runs.busy(shared)
    assert "other work used 1.4 cores" in chapter_runs.run_text(shared)
    assert "busy" not in chapter_runs.badge_text(record, "book/b", 1)[0]
    rows = chapter_runs.table_rows(record, [("book/a", "A", 1), ("book/b", "B", 1)])
    assert [r[1] for r in rows] == ["1 min 30 s (busy machine)", "9 s"]


def test_part_rows_add_up_run_times_and_announced_exercise_minutes(tmp_path):
    """The landing page's table by part: the chapters' runs added up, and the exercises with the
    minutes each announces, in its heading or on the line under it, or in a prose cell after a
    heading alone (helpers.say, reader_markup's form)."""
    a, b = tmp_path / "a.ipynb", tmp_path / "b.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(
        "## Exercises\n\n### Exercise 1: one (warm-up, 5 min)\n\nText.\n\n"
        "### Exercise 2: two (core, 10 min)\n### Exercise 3: three\n\n*Core, 20 minutes.*")]
    nbformat.write(nb, a)
    heading = nbformat.v4.new_markdown_cell("### Exercise 1: alone")
    said = nbformat.v4.new_code_cell('#@title Text\nhelpers.say(r"""\n*Open-ended, 45 '
                                     'minutes.* Do {x}.\n""")')
    said.metadata["course"] = {"prose": True, "glued": ["x"]}
    plain = nbformat.v4.new_code_cell("# ### Exercise 9: not prose (99 min)")
    nb.cells = [heading, said, plain]
    nbformat.write(nb, b)
    assert chapter_runs.exercise_minutes(a) == (3, 35)
    assert chapter_runs.exercise_minutes(b) == (1, 45)
    rows = chapter_runs.part_rows(RECORD, [("P", [("book/a", a), ("book/b", b)]),
                                           ("pages only", [])])
    assert rows == [("P", "49 s", "4", "1 h 20 min")]
    assert len(rows[0]) == len(chapter_runs.PART_HEAD)


def test_every_exercise_of_the_book_announces_its_time():
    """Else the table by part would count it as 0 minutes."""
    for path in toc_notebooks():
        text = "\n\n".join(map(chapter_runs._prose, json.loads(path.read_text())["cells"]))
        silent = [m.group(0).splitlines()[0] for m in chapter_runs.EXERCISE.finditer(text)
                  if not chapter_runs.MINUTES.search(m.group(0))]
        assert not silent, f"{path.name}: {silent} announce no time"


def test_a_chapter_missing_from_the_record_is_an_error():
    with pytest.raises(chapter_runs.MissingRun, match="make outputs NB=book/c.ipynb"):
        chapter_runs.table_rows(RECORD, [("book/a", "A", 2), ("book/c", "C", 1)])
    with pytest.raises(chapter_runs.MissingRun, match="book/c"):
        chapter_runs.badge_text(RECORD, "book/c", 1)
    only_full = {"book/c": {"full": _run(9.0)}}   # the CPU default size is the required one
    with pytest.raises(chapter_runs.MissingRun):
        chapter_runs.badge_text(only_full, "book/c", 1)


def test_a_record_that_is_not_a_run_is_refused(tmp_path):
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"book/a": {"small": {"seconds": 3.0}}}))
    with pytest.raises(ValueError, match="missing"):
        chapter_runs.load(path)
    path.write_text(json.dumps({"book/a": {"sometimes": _run(3.0)}}))
    with pytest.raises(ValueError, match="unknown size"):
        chapter_runs.load(path)


def test_gpu_count_is_declared_in_the_notebook(tmp_path):
    nb = nbformat.v4.new_notebook()
    path = tmp_path / "x.ipynb"
    for meta, ok in (({"gpus": 2}, 2), ({"gpus": 0}, 0), ({}, None), ({"gpus": True}, None),
                     ({"gpus": -1}, None), ({"gpus": "2"}, None)):
        nb.metadata["course"] = meta
        nbformat.write(nb, path)
        if ok is None:
            with pytest.raises(chapter_runs.MissingRun, match='"course": {"gpus": N}'):
                chapter_runs.gpus_wanted(path)
        else:
            assert chapter_runs.gpus_wanted(path) == ok


def test_a_build_fails_when_a_chapter_has_no_run(tmp_path, monkeypatch):
    """The landing page's table (```{chapter-runs}```) in a real Sphinx build: one row per
    notebook of _toc.yml; a notebook missing from the record fails the build under -W."""
    from sphinx.application import Sphinx
    from sphinx.errors import SphinxWarning
    from sphinx.util.docutils import docutils_namespace
    src = tmp_path / "src"
    (src / "book").mkdir(parents=True)
    (src / "conf.py").write_text(f"import sys\nsys.path.insert(0, {str(EXT)!r})\n"
                                 "extensions = ['course_badges']\n")
    (src / "index.rst").write_text("Title\n=====\n\n.. chapter-runs::\n")
    (src / "_toc.yml").write_text("root: index\nparts:\n- chapters:\n  - file: book/a\n"
                                  "  - file: book/b\n")
    for doc, gpus in (("a", 2), ("b", 0)):
        nb = nbformat.v4.new_notebook(metadata={"course": {"gpus": gpus}})
        nbformat.write(nb, src / "book" / f"{doc}.ipynb")
    record = tmp_path / "runs.json"
    monkeypatch.setattr(chapter_runs, "RECORD", record)

    def build(runs):
        record.write_text(json.dumps(runs))
        out = tmp_path / f"out{len(runs)}"
        with docutils_namespace():   # a fresh Sphinx per build in one process
            Sphinx(str(src), str(src), str(out), str(out / ".doctrees"), "html",
                   warningiserror=True, status=None, freshenv=True).build()
        return (out / "index.html").read_text()

    html = build(RECORD)
    chapters, by_part = html.split("By part:")[0].rsplit("<table", 1)[0], html
    assert chapters.count("<tr") == 3, "a header row and one row per chapter"
    assert by_part.count("<tr") == 3 + 2, "then a header row and one row per part"
    assert "49 s" in html, "the part's run time: its chapters' (45 s and 4 s) added up"
    assert "5 min 01 s" in html and "1.5 GiB" in html and "not measured yet" in html
    html = build({d: {"small": m["small"]} for d, m in RECORD.items()})
    assert "not measured yet" not in html and html.count("full size") == 1, \
        "no full-size column: the caption says it once"
    with pytest.raises(SphinxWarning, match="book/b has no run"):
        build({"book/a": RECORD["book/a"]})


# ---------------------------------------------------------------- the committed record
def test_every_chapter_has_a_run_and_a_gpu_count():
    record = chapter_runs.load()
    chapters = [p.relative_to(ROOT).with_suffix("").as_posix() for p in toc_notebooks()]
    missing = [d for d in chapters if chapter_runs.REQUIRED not in record.get(d, {})]
    assert not missing, (f"no run at the CPU default size in book/_ext/runs.json for {missing}: "
                         "`make outputs NB=...` records one")
    for path in toc_notebooks():
        chapter_runs.gpus_wanted(path)
    assert not set(record) - set(chapters), "runs of pages that are no chapter any more"


def test_a_run_stored_with_the_outputs_matches_them():
    """A record made with the stored outputs (`make outputs`) took as long as their cells say:
    the notebook was not re-executed without recording its run."""
    record = chapter_runs.load()
    ex = _executor()
    for path in toc_notebooks():
        doc = path.relative_to(ROOT).with_suffix("").as_posix()
        # the committed outputs are the CPU default size's (a GPU machine's stay there)
        for mode, entry in record.get(doc, {}).items():
            if entry.get("stored") and mode == "small":
                seconds = ex.cells_seconds(nbformat.read(path, as_version=4))
                assert seconds is not None and abs(seconds - entry["seconds"]) <= 0.1, (
                    f"{doc}: its stored outputs took {seconds} s, book/_ext/runs.json says "
                    f"{entry['seconds']} s at the {chapter_runs.MODES[mode]}: commit the record "
                    "`make outputs` wrote with them")


# ---------------------------------------------------------------- how make outputs measures
def test_the_sampler_adds_up_a_process_tree():
    """A parent holding ~50 MB that starts a child holding ~150 MB: both counted."""
    code = textwrap.dedent("""
        import subprocess, sys, time
        keep = bytearray(50 * 2 ** 20)
        child = ("import time; b = bytearray(150 * 2 ** 20); "
                 "b[::4096] = b'x' * len(b[::4096]); time.sleep(3)")
        subprocess.run([sys.executable, "-c", child])
    """)
    proc = subprocess.Popen([sys.executable, "-c", code])
    sampler = _executor().TreeSampler(proc.pid, interval=0.05)
    sampler.start()
    proc.wait()
    sampler.stop()
    assert sampler.processes == 2
    assert sampler.peak_bytes >= 190 * 2 ** 20, sampler.peak_bytes


def test_the_sampler_does_not_slow_the_run_it_measures():
    """Reading USS walks every page of a process: the sampler reads it on a new high of RSS
    only, so sampling a steady 400 MB process costs it a small part of a core (while RSS grows,
    each sample is a new high): reading USS at every sample would cost more than the bound,
    which leaves room for a busy 2-core machine."""
    code = "import time; b = bytearray(400 * 2 ** 20); b[::4096] = b'x' * len(b[::4096]); " \
           "time.sleep(4)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    sampler = _executor().TreeSampler(proc.pid, interval=0.1)
    t0 = time.monotonic()
    sampler.start()
    proc.wait()
    sampler.stop()
    assert sampler.peak_bytes >= 390 * 2 ** 20, sampler.peak_bytes
    assert sampler.cpu_s < 0.12 * (time.monotonic() - t0), sampler.cpu_s


def test_the_sampler_tells_the_runs_own_work_from_other_work():
    """Two trees sampled at the same time: one keeps a core busy until it has used 1.5 s of CPU,
    one sleeps. Each sampler must leave its own tree out: the sleeper sees the burner as other
    work, the burner does not see itself (whatever else the machine runs meanwhile is in both,
    and cancels). A busy machine gives the burner less than a core, so the gap is judged against
    the share of a core the burner itself reports having had."""
    burn = ("import time; t = time.monotonic()\n"
            "while time.process_time() < 1.5: pass\n"
            "print(time.process_time() / (time.monotonic() - t))")
    burner = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    samplers = [_executor().TreeSampler(p.pid, interval=0.1) for p in (burner, sleeper)]
    for s in samplers:
        s.start()
    try:
        share = float(burner.communicate(timeout=120)[0])
        for s in samplers:
            s.stop()
    finally:
        sleeper.kill()
        sleeper.wait()
    seen_by_burner, seen_by_sleeper = (s.other_cores() for s in samplers)
    assert 0 < share <= 1.2, share
    gap = seen_by_sleeper - seen_by_burner
    assert gap >= 0.5 * share, (gap, share, seen_by_burner, seen_by_sleeper)


def test_execute_records_a_run_and_refuses_errors(tmp_path, monkeypatch):
    """`make outputs` on a notebook whose cell starts a process: stored outputs, and a record
    with the cells' seconds, the child counted; a failing notebook stores and records nothing."""
    monkeypatch.delenv("COURSE_QUICK", raising=False)
    monkeypatch.delenv("COURSE_FULL", raising=False)
    ex = _executor()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import subprocess, sys\n"
        "subprocess.run([sys.executable, '-c', 'import time; b = bytearray(100 * 2 ** 20); "
        "b[::4096] = bytes(len(b[::4096])); time.sleep(1.5)'])\nprint('done')")]
    path, record = tmp_path / "spawns.ipynb", tmp_path / "runs.json"
    nbformat.write(nb, path)
    ex.execute(path, record=record)
    stored = nbformat.read(path, as_version=4)
    assert stored.cells[0].outputs[0]["text"] == "done\n"
    (mode, entry), = json.loads(record.read_text())["spawns"].items()
    assert mode == chapter_runs.run_mode({}, ex.machine()[1])
    assert entry["processes"] >= 2 and entry["peak_bytes"] >= 100 * 2 ** 20
    assert entry["stored"] and abs(entry["seconds"] - ex.cells_seconds(stored)) < 0.05
    assert entry["cores"] >= 1 and entry["load"] is not None
    assert 1.5 <= entry["seconds"] < 60
    bad = nbformat.v4.new_notebook()
    bad.cells = [nbformat.v4.new_code_cell("1 / 0")]
    path = tmp_path / "fails.ipynb"
    nbformat.write(bad, path)
    before = path.read_text()
    with pytest.raises(SystemExit, match="ZeroDivisionError"):
        ex.execute(path, record=record)
    assert path.read_text() == before and "fails" not in json.loads(record.read_text())


def test_widget_state_is_dropped_only_when_the_page_shows_a_twin():
    ex = _executor()
    view = {"application/vnd.jupyter.widget-view+json": {"model_id": "m"}, "text/plain": "w"}
    for data, dropped in ((dict(view, **{"text/html": "<p>twin</p>"}), True), (view, False)):
        nb = nbformat.v4.new_notebook(metadata={"widgets": {"state": {}}})
        cell = nbformat.v4.new_code_cell("w")
        cell.outputs = [nbformat.v4.new_output("display_data", data=data)]
        nb.cells = [cell]
        assert ex.drop_unshown_widget_state(nb) == dropped
        assert ("widgets" in nb.metadata) != dropped


def test_a_stored_notebook_says_its_new_run_time(tmp_path):
    """`make outputs` rewrites the sentence under the "Runs on" line with the run it stores (a
    reader outside the book sees it there); twice gives one sentence, the newest."""
    ex = _executor()
    nb = nbformat.v4.new_notebook(metadata={"course": {"gpus": 2}})
    nb.cells = [nbformat.v4.new_markdown_cell("# T\n\n*Runs on: CPU, several GPUs.*")]
    record = tmp_path / "runs.json"
    record.write_text("{}")
    for seconds in (45.0, 61.0):
        ex.refresh_runs_line(nb, "book/t", "small", _run(seconds, 1500, 3), record)
    line = chapter_runs.notebook_line({"book/t": {"small": _run(61.0, 1500, 3)}}, "book/t", 2)
    assert nb.cells[0].source == f"# T\n\n*Runs on: CPU, several GPUs.* {line}"
    assert "1 min 01 s" in line and nb.cells[0].source.count("Run time:") == 1
