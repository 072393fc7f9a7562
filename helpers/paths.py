"""Where the course's scripts and committed data are, wherever `helpers` is installed.

In a checkout (or an editable install) they are the files under scripts/ and reference/; a plain
install (`pip install git+...`, a wheel: what the notebooks' set-up cell installs in Colab or
Kaggle) ships scripts/ddp/*.py, scripts/bench.py and reference/*.json inside the package,
as helpers/_scripts/ and helpers/_reference/ (pyproject.toml maps those folders).
"""
from pathlib import Path

__all__ = ["script_path", "course_file"]

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
