"""Stage the book with the outputs of a fresh run, for `make test-book-fresh`.

nbval (`make test-notebooks`) writes every notebook it ran, with that run's outputs, under
_build/executed/ (book/conftest.py). This copies the book's sources into _build/fresh/, puts
those notebooks in place of the stored ones and writes a config that does not execute again.
Building _build/fresh with -W then fails where a fresh run would break `make book` (which
executes every chapter), without executing the chapters a second time.

Usage: python scripts/fresh_book.py [--executed _build/executed] [--out _build/fresh]
Refuses when a chapter of _toc.yml has no fresh copy (the build would show stored outputs).
"""
import argparse
import pathlib
import shutil
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))
from book_config import variant  # noqa: E402
from book_files import toc_notebooks  # noqa: E402


def stage(executed, out):
    """Copy the book into `out` with the fresh notebooks; return how many were replaced."""
    chapters = [p.relative_to(ROOT) for p in toc_notebooks()]
    missing = [str(c) for c in chapters if not (executed / c).is_file()]
    if missing:
        raise SystemExit(f"no fresh run of {', '.join(missing)} under {executed}: run "
                         f"`make test-notebooks` (nbval writes them there) first")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copytree(ROOT / "book", out / "book")
    shutil.copy2(ROOT / "_toc.yml", out / "_toc.yml")
    config = variant(yaml.safe_load((ROOT / "_config.yml").read_text()), "off")
    (out / "_config.yml").write_text(
        "# Written by scripts/fresh_book.py from _config.yml: do not edit.\n"
        + yaml.safe_dump(config, sort_keys=False))
    for c in chapters:
        shutil.copy2(executed / c, out / c)
    return len(chapters)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executed", default=str(ROOT / "_build" / "executed"))
    ap.add_argument("--out", default=str(ROOT / "_build" / "fresh"))
    args = ap.parse_args(argv)
    n = stage(pathlib.Path(args.executed), pathlib.Path(args.out))
    print(f"staged {n} chapters with this run's outputs in {args.out}")


if __name__ == "__main__":
    sys.exit(main())
