"""Where the course's scripts are, wherever `helpers` is installed.

In a checkout (or an editable install) they are the files under scripts/; a plain install
(`pip install git+...`, a wheel) ships scripts/ddp/*.py as package data `helpers/_scripts/ddp/`
(pyproject.toml maps that folder), so the torchrun chapter runs the same files in Colab too.
"""
from importlib import resources
from pathlib import Path

__all__ = ["script_path"]

_CHECKOUT = Path(__file__).resolve().parent.parent / "scripts"


def _installed(folder):
    try:
        return Path(str(resources.files("helpers._scripts").joinpath(folder)))
    except (ModuleNotFoundError, TypeError):   # a checkout on sys.path: no package data there
        return None


def script_path(name, folder="ddp"):
    """The path of scripts/<folder>/<name> (e.g. "torchrun.py"): the checkout's file if there is
    one, else the copy installed with helpers. Raises FileNotFoundError naming what exists."""
    places = [p for p in (_CHECKOUT / folder, _installed(folder)) if p is not None]
    for place in places:
        if (place / name).is_file():
            return (place / name).resolve()
    have = sorted({f.name for p in places if p.is_dir() for f in p.glob("*.py")})
    raise FileNotFoundError(
        f"no course script {folder}/{name} in {', '.join(map(str, places))}; the scripts there: "
        f"{have or 'none'}. Install the course with `pip install -e <checkout>` or from git.")
