"""Run a command and say how much CPU it and every process it started used, beside its wall time.

`make test` wraps its long stages in it: a stage near 2 cores' worth of CPU per second of wall
(on 2 cores) is bound by its work, and only fewer or cheaper processes make it shorter; one well
below is waiting (timeouts, rendezvous, a last long module), and more workers or a better order
would help. `time` cannot tell: the ranks a fork server starts are reaped by the server, which
outlives its caller, so their CPU never reaches the shell. Here this process is the children's
subreaper (Linux): orphans are handed to it and reaped, so their CPU counts.

Usage: python scripts/cpu_use.py LABEL COMMAND [ARG ...]   (exits with the command's status)
"""
import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper():
    """True where orphaned descendants will be reparented to this process (Linux 3.4+)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def run_reaping(command):
    """Run `command`, reaping every child as it ends (orphans included: no zombies pile up),
    until the command itself has ended; its exit status (128 + N for signal N)."""
    proc = subprocess.Popen(command, close_fds=False)   # make's jobserver pipes stay open
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except KeyboardInterrupt:   # the terminal's Ctrl-C reached the command too
            continue
        if pid == proc.pid:
            rc = os.waitstatus_to_exitcode(status)
            proc.returncode = rc
            return rc if rc >= 0 else 128 - rc


def reap_orphans(grace=2.0):
    """Reap the descendants still running, waiting up to `grace` seconds for them to end."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.1)


def main(argv):
    if len(argv) < 2:
        sys.exit("usage: python scripts/cpu_use.py LABEL COMMAND [ARG ...]")
    label, command = argv[0], argv[1:]
    counted = "every process" if become_subreaper() else "the processes reaped in turn"
    t0 = time.monotonic()
    rc = run_reaping(command)
    reap_orphans()
    wall = time.monotonic() - t0
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = use.ru_utime + use.ru_stime
    print(f"cpu_use: {label}: {cpu:.0f} s of CPU ({counted}) in {wall:.0f} s, "
          f"{cpu / max(wall, 1e-9):.2f} of {os.cpu_count()} cores busy on average", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
