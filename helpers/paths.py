"""Where the course's scripts and committed data are, wherever `helpers` is installed.

In a checkout (or an editable install) they are the files under scripts/ and reference/; a plain
install (`pip install git+...`, a wheel: what the notebooks' set-up cell installs in Colab or
Kaggle) ships scripts/ddp/*.py, scripts/bench.py and reference/*.json inside the package,
as helpers/_scripts/ and helpers/_reference/ (pyproject.toml maps those folders).
"""
import difflib
from pathlib import Path

__all__ = ["script_path", "course_file", "script_lines", "script_diff"]

_HERE = Path(__file__).resolve().parent
_CHECKOUT = _HERE.parent


def _places(folder, checkout, installed):
    """The checkout's folder (only where helpers sits in a checkout: beside its pyproject.toml,
    not in a site-packages that may hold anything), then the installed copy."""
    here = [_HERE / installed / folder]
    return ([_CHECKOUT / checkout / folder] if (_CHECKOUT / "pyproject.toml").is_file()
            else []) + here


def _find(name, places, what):
    for place in places:
        if (place / name).is_file():
            return (place / name).resolve()
    have = sorted({f.name for p in places if p.is_dir() for f in p.iterdir() if f.is_file()})
    raise FileNotFoundError(
        f"no course {what} {name} in {', '.join(map(str, places))}; there: {have or 'nothing'}. "
        "Install the course with `pip install -e <checkout>` or from git.")


def script_path(name, folder="ddp"):
    """The path of scripts/<folder>/<name> (e.g. "torchrun.py"; folder "" for scripts/ itself,
    e.g. "bench.py"): the checkout's file if there is one, else the copy installed with helpers.
    Raises FileNotFoundError naming what exists."""
    return _find(name, _places(folder, "scripts", "_scripts"), "script")


def course_file(name, folder="reference"):
    """The path of a committed data file (e.g. reference/gpu_reference.json), as script_path."""
    return _find(name, _places("", folder, "_" + folder), "file")


def script_lines(name, folder="ddp"):
    """A script's code without its docstring and its failure-injection demo (torchrun.py's
    --fail-* options and fail_on_purpose), so that a diff shows what DDP itself needs."""
    text = script_path(name, folder).read_text()
    lines = text.split('"""\n', 1)[-1].splitlines()
    out, demo, open_ = [], False, 0   # open_: a dropped call's open brackets
    for line in lines:
        demo = demo or line.startswith(("def fail_on_purpose", 'p.add_argument("--fail'))
        if demo and line.startswith(("step =", "_, _, env")):   # the first line after the demo
            demo = False
        if open_ or (not demo and "fail" in line):   # a line using the demo, and its continuation
            open_ = max(0, open_ + line.count("(") - line.count(")"))
        elif not demo and "import signal" not in line:
            out.append(line)
    return out


def script_diff(a, b, folder="ddp"):
    """The lines that differ between two of the course's scripts (script_lines of each), as a
    unified diff without its @@ position lines."""
    diff = difflib.unified_diff(script_lines(a, folder), script_lines(b, folder), a, b, n=0,
                                lineterm="")
    return "\n".join(line for line in diff if not line.startswith("@@"))
