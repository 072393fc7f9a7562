"""The course leaves no temporary folder behind: a check that saves a checkpoint and a launch
(one that succeeds, one whose rank raises) each remove what they made under TMPDIR, and the
process that ran them leaves TMPDIR empty when it exits."""
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, "tests")
    import launch_targets as lt
    import helpers
    from helpers.checks import check_dcp_resume
    from test_checks_part5_fsdp2 import dcp_resume

    def left():
        # the fork server's socket folder (pymp-*) lives as long as this process
        return [n for n in mine() if not n.startswith("pymp-")]

    def mine():
        # torchinductor_<user>: torch's compile cache, one per user, kept on purpose
        return sorted(n for n in os.listdir(os.environ["TMPDIR"])
                      if not n.startswith("torchinductor_"))

    def resume(model, optimizer, path):   # the exercise's worked answer
        return dcp_resume(model, optimizer, path)

    def wrong(model, optimizer, path):
        raise ValueError("not loaded")

    if __name__ == "__main__":
        for fn in (resume, wrong):
            try:
                check_dcp_resume(fn)
            except Exception:
                pass
            print("check", fn.__name__, left())
        print("launch", helpers.launch(lt.report, 2, quiet=True)[1]["sum"], left())
        try:
            helpers.launch(lt.raise_on_rank_1, 2, quiet=True)
        except Exception as e:
            print("failed launch", type(e).__name__, left())
""")


def test_checks_and_launches_leave_no_temporary_folder():
    # a short path: the fork server's socket in it must fit AF_UNIX's 108 bytes
    with tempfile.TemporaryDirectory(prefix="t-") as d:
        run = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                             text=True, timeout=600,
                             env=dict(os.environ, TMPDIR=d, OMP_NUM_THREADS="1"))
        assert run.returncode == 0, run.stderr[-3000:]
        said = [line for line in run.stdout.splitlines()
                if line.startswith(("check ", "launch ", "failed launch "))]
        assert said == ["check resume []", "check wrong []", "launch 3.0 []",
                        "failed launch RankFailed []"], run.stdout + run.stderr[-3000:]
        # at its exit the process removed its fork server's folder too
        assert [n for n in os.listdir(d) if not n.startswith("torchinductor_")] == []


def test_what_a_test_run_starts_keeps_its_temporary_files_in_the_runs_folder():
    """The repository's conftest.py: a folder of this run's, removed when the run ends (nbval's
    killed kernels cannot remove their own)."""
    assert Path(os.environ["TMPDIR"]).name.startswith("course-tests-")
    assert Path(os.environ["TMPDIR"]).is_dir()
