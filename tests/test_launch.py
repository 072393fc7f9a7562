"""helpers.launch, the one way ranks start: results per rank, a rank that raises, dies or hangs
reported by rank (never a hang), functions a rank cannot import refused with the fix, threads,
a stale MASTER_ADDR, and no orphans when the caller is killed."""
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import launch_targets as lt
import pytest
import torch

import helpers
from helpers.runtime import progress
from helpers.runtime.errors import LaunchTimeout
from helpers.runtime.progress import report_progress

ROOT = Path(__file__).resolve().parent.parent


def _gone(pid):
    """True once `pid` no longer runs (a zombie waiting for its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        pass
    else:
        return "\nState:\tZ" in state
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_results_come_back_per_rank_even_with_a_stale_master_addr(monkeypatch, capsys):
    monkeypatch.setenv("MASTER_ADDR", "10.255.255.1")   # left over from another run: unroutable
    got = helpers.launch(lt.report, 2)
    assert [g["rank"] for g in got] == [0, 1] and all(g["world"] == 2 for g in got)
    assert [g["sum"] for g in got] == [3.0, 3.0], "the ranks joined one group"
    assert all(g["threads"] == 1 for g in got), "one intra-op thread per rank"
    assert {g["master_addr"] for g in got} == {"127.0.0.1"}
    assert {g["backend"] for g in got} == {"gloo"} and {g["device"] for g in got} == {"cpu"}
    assert torch.equal(got[1]["tensor"], torch.arange(3)), "tensors come back"
    assert len({g["pid"] for g in got} | {os.getpid()}) == 3, "one process per rank"
    assert "2 ranks" in capsys.readouterr().out, "one line says what was chosen"


@pytest.mark.skipif(sys.platform == "win32", reason="no fork server on Windows")
def test_ranks_fork_from_a_server_with_the_callers_environment_of_now(monkeypatch):
    """Ranks fork from a fork server that imported torch, torchvision and helpers once (a rank
    starts in a fraction of a second; one that loads data would import torchvision, and with it
    torch._dynamo, 1.6 s of CPU, on its own); each still gets the caller's environment as it is
    at the launch, not as it was when the server started. COURSE_START=spawn starts fresh
    interpreters."""
    helpers.launch(lt.how_started, 2, quiet=True)          # the server runs from here on
    monkeypatch.setenv("COURSE_LAUNCH_PROBE", "set after the server started")
    forked = helpers.launch(lt.how_started, 2, quiet=True)
    for r in forked:
        assert r["ppid"] != os.getpid(), "a rank's parent should be the fork server"
        assert r["had_helpers"] and r["had_torchvision"] and r["threads"] == 1
        assert r["probe"] == "set after the server started", r
    monkeypatch.setenv("COURSE_START", "spawn")
    spawned = helpers.launch(lt.how_started, 2, quiet=True)
    assert [r["ppid"] for r in spawned] == [os.getpid()] * 2
    assert all(r["probe"] == "set after the server started" for r in spawned)
    monkeypatch.setenv("COURSE_START", "fork")
    with pytest.raises(ValueError, match="COURSE_START='fork'"):
        helpers.launch(lt.how_started, 2, quiet=True)


def test_a_rank_that_raises_is_named_with_its_traceback():
    t0 = time.monotonic()
    with pytest.raises(helpers.RankFailed) as info:
        helpers.launch(lt.raise_on_rank_1, 2, quiet=True, timeout=120)
    e = info.value
    assert e.rank == 1 and e.cause.startswith("ValueError: the answer is not 42")
    assert "raise_on_rank_1" in e.tail and "rank 1 failed" in str(e)
    assert time.monotonic() - t0 < 100, "rank 0 was stopped, not waited for"


def test_a_killed_rank_is_an_error_not_a_hang():
    with pytest.raises(helpers.RankFailed) as info:
        helpers.launch(lt.die_on_rank_1, 2, quiet=True, timeout=120)
    assert info.value.rank == 1 and "SIGKILL" in info.value.cause


def test_a_rank_gloo_aborts_says_why():
    """Ranks that disagree on a collective: gloo prints the mismatch on the rank's stderr and
    aborts the process. The RankFailed carries those last lines, not only "SIGABRT"."""
    with pytest.raises(helpers.RankFailed) as info:
        helpers.launch(lt.mismatch_on_rank_1, 2, quiet=True, timeout=60)
    e = info.value
    assert e.rank == 0 and "SIGABRT" in e.cause, e
    assert "collective mismatch" in e.stderr and "collective mismatch" in str(e), str(e)


def test_a_rank_that_exits_without_a_result_is_named_with_the_fix():
    with pytest.raises(helpers.RankFailed) as info:
        helpers.launch(lt.exit_quietly_on_rank_1, 2, quiet=True, timeout=60)
    assert info.value.rank == 1 and "without handing in a result" in info.value.cause
    assert "return the result instead" in str(info.value)


def test_a_hung_rank_times_out_and_is_stopped(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        helpers.launch(lt.hang_on_rank_1, 2, quiet=True, timeout=8)
    assert 1 in info.value.ranks and "still running after 8 s" in str(info.value)
    assert time.monotonic() - t0 < 8 + 15, "stopped promptly after the timeout"


def test_functions_a_rank_cannot_import_are_refused_with_the_fix():
    def local(rank, world, cfg):
        return rank
    notebook = lambda rank, world, cfg: rank
    notebook.__module__ = "__main__"
    for fn, where in [(local, "inside a function"), (notebook, "in the notebook")]:
        with pytest.raises(ValueError, match=where) as info:
            helpers.launch(fn, 2)
        assert "into a module" in str(info.value) and "threads=True" in str(info.value)
    with pytest.raises(TypeError, match="cfg must pickle"):
        helpers.launch(lt.report, 2, dict(f=lambda: 0))
    with pytest.raises(ValueError, match="world"):
        helpers.launch(lt.report, 0)
    with pytest.raises(ValueError, match="not .label, function, kwargs."):
        helpers.run_ranks(2, [("zero1", {})])
    twice = [("a", lt.report, {}), ("a", lt.report, {})]
    with pytest.raises(ValueError, match="repeat; give each run its own"):
        helpers.run_ranks(2, twice)


def test_run_ranks_runs_experiments_in_turn_on_thread_ranks_too():
    """run_ranks is the one way to run several experiments in one launch, on process ranks and
    thread ranks alike: each experiment gets the rank's comm, a barrier between them."""
    def plus(rank, world, cfg):                     # defined here: only threads can run it
        t = torch.tensor([float(rank + cfg["add"])])
        cfg["comm"].all_reduce(t)
        return float(t)
    got = helpers.run_ranks(2, [("a", plus, dict(add=1)), ("b", plus, dict(add=10))],
                            threads=True, timeout=20)
    assert got == [dict(a=3.0, b=21.0)] * 2, got


def test_threads_run_any_callable_through_a_thread_comm():
    assert helpers.launch(lt.thread_sum, 3, threads=True) == [6.0, 6.0, 6.0]

    def in_notebook(rank, world, cfg):
        if rank == 2:
            raise KeyError("no such shard")
        return rank
    with pytest.raises(helpers.RankFailed) as info:
        helpers.launch(in_notebook, 3, threads=True, timeout=5)
    assert info.value.rank == 2 and isinstance(info.value.original, KeyError)

    def waits_forever(rank, world, cfg):
        cfg["comm"].recv(1 - rank, (1,))                          # nobody sends
    with pytest.raises(helpers.RankFailed, match="never sent"):
        helpers.launch(waits_forever, 2, threads=True, timeout=2)


def test_killing_the_caller_leaves_no_rank_running(tmp_path):
    """SIGKILL, and the caller not yet reaped by its own parent (a zombie until this test waits
    for it, as under a supervisor that reaps later): its ranks leave all the same."""
    script = textwrap.dedent(f"""
        import helpers, launch_targets
        helpers.launch(launch_targets.sleep_and_write_pid, 2, dict(folder={str(tmp_path)!r}),
                       quiet=True)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    parent = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        pids, t0 = [], time.monotonic()
        while len(pids) < 2 and time.monotonic() - t0 < 240 and parent.poll() is None:
            time.sleep(0.2)
            pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid") if p.read_text()]
        ended = parent.poll()
        assert len(pids) == 2, (f"{len(pids)} of 2 ranks wrote their pid; the launching process "
                                + ("ran on" if ended is None else f"exited with {ended}"))
        parent.send_signal(signal.SIGKILL)          # not reaped: no wait() until the end
        t0 = time.monotonic()
        while not all(_gone(p) for p in pids) and time.monotonic() - t0 < 15:
            time.sleep(0.2)
        assert all(_gone(p) for p in pids), "ranks outlived the launching process"
    finally:
        parent.kill()
        parent.wait(30)


def test_a_script_without_a_main_guard_is_told_the_fix(tmp_path):
    """Ranks start by importing the launching script; one that calls launch at its top level
    would launch again from every rank. It fails with the fix, not an internal assertion."""
    script = tmp_path / "no_guard.py"
    script.write_text("import helpers, launch_targets\n"
                      "helpers.launch(launch_targets.report, 2, quiet=True)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
               COURSE_START="forkserver")
    got = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=240)
    assert got.returncode != 0
    assert 'under `if __name__ == "__main__":`' in got.stderr
    assert "AssertionError" not in got.stderr, got.stderr[-2000:]
    assert got.stderr.count("Traceback") == 1 and "multiprocessing" not in got.stderr, \
        f"one message, not a rank's traceback too:\n{got.stderr[-3000:]}"


def test_progress_shows_one_line_on_a_terminal_and_clears_it(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "_progress_file", None)
    report_progress(1, 10, "epoch")                         # outside a launch: nothing
    assert not list(tmp_path.iterdir())
    progress.report_to(tmp_path / "rank0.progress")
    monkeypatch.setattr(progress, "_last_report", 0.0)
    report_progress(3, 10, "epoch")
    line = progress.ProgressLine(2, tmp_path, quiet=False)
    line.mode, line.t0 = "tty", time.monotonic() - 5                # a terminal, 5 s in
    fake = io.StringIO()
    monkeypatch.setattr(sys, "stderr", fake)
    line.update()
    assert fake.getvalue().startswith("\r2 ranks running, 5 s: rank 0 epoch 3/10")
    line.close()
    assert fake.getvalue().endswith("\r") and fake.getvalue().count("\n") == 0
    assert progress.ProgressLine(2, tmp_path, quiet=True).mode is None


def _children(pid):
    """Pids of the processes whose parent is `pid` (Linux /proc)."""
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
        except OSError:
            continue
        if f"\nPPid:\t{pid}\n" in text and "\nState:\tZ" not in text:
            out.append(int(status.parent.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_killing_spawn_py_leaves_no_rank_running():
    """The script that teaches mp.spawn: its ranks join through helpers.setup, which makes them
    leave with their parent (a killed notebook or terminal leaves no rank behind)."""
    script = ROOT / "scripts" / "ddp" / "spawn.py"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    parent = subprocess.Popen([sys.executable, str(script), "--nprocs", "2", "--backend", "gloo",
                               "--subset", "64", "--batch-size", "32", "--epochs", "100000"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        said = []
        for line in parent.stdout:                 # rank 0 logs once every rank has joined
            said.append(line)
            if line.startswith("epoch 1:"):
                break
        else:   # it stopped before training: say why (e.g. Fashion-MNIST not in data/)
            pytest.fail("spawn.py stopped before its first epoch, so there were no ranks to "
                        "kill; it said:\n" + "".join(said[-15:]))
        ranks = _children(parent.pid)
        assert len(ranks) >= 2, f"spawn.py trains with {len(ranks)} child processes, not 2"
        parent.send_signal(signal.SIGTERM)
        parent.wait(30)
        t0 = time.monotonic()
        while not all(_gone(p) for p in ranks) and time.monotonic() - t0 < 15:
            time.sleep(0.2)
        assert all(_gone(p) for p in ranks), "spawn.py's ranks outlived their parent"
    finally:
        parent.kill()


def test_a_kernel_run_by_a_program_shows_no_progress_line(monkeypatch, tmp_path):
    """The book build and nbval run cells with stdin off: no progress display (an emptied one is
    still an output, and takes a labelled figure's label in its cell); a person's kernel gets it."""
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from helpers.runtime import progress\n"
        "print(progress.ProgressLine(2, '.', quiet=False).mode)")])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    assert nb.cells[0].outputs[0]["text"].strip() == "None"

    class Kernel:
        _allow_stdin = True

    class Shell:
        kernel, config = Kernel(), {"IPKernelApp": {}}

    import IPython
    monkeypatch.setattr(IPython, "get_ipython", lambda: Shell())
    assert progress.ProgressLine(2, tmp_path, quiet=False).mode == "jupyter"
    Kernel._allow_stdin = False
    assert progress.ProgressLine(2, tmp_path, quiet=False).mode is None


def test_take_reads_cfg_and_refuses_typos():
    """take returns the required keys then the defaults in order; a missing key or one it does
    not expect (a typo that would otherwise run the default) is refused, naming both lists."""
    from helpers.runtime.launch import take
    assert take({"a": 1, "b": 2}, "a", b=0, c=3) == [1, 2, 3]
    assert take({"a": 1, "device": "cpu", "comm": None}, "a") == [1]
    with pytest.raises(TypeError, match=r"lacks \['a'\]"):
        take({}, "a")
    with pytest.raises(TypeError, match=r"unexpected \['stpes'\] \(a typo\? 'stpes' -> "
                                        r"'steps'\).*optionally \['steps'\]"):
        take({"stpes": 5}, steps=1)
    with pytest.raises(TypeError, match=r"lacks \['a'\] and has unexpected \['zzz'\]: "):
        take({"zzz": 5}, "a")   # nothing near: no guess


def test_importing_helpers_loads_no_plotting_library():
    """Every rank, launcher and script imports helpers; matplotlib.pyplot cost each of them
    about 0.4 s of CPU (a tenth of `import helpers`), so only the drawing code imports it."""
    code = "import sys, helpers; print(sorted(m for m in sys.modules if 'matplotlib' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "[]", f"import helpers imported {out.strip()[:300]}"
