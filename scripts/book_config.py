"""Write a variant of _config.yml for a build that does not execute the notebooks.

Usage: python scripts/book_config.py --execute off --out _build/_config.test.yml
then   jupyter-book build . --config _build/_config.test.yml
`make test-book` uses it: nbval already ran every notebook, and the pages show the outputs stored
by `make outputs`. Jupyter Book resolves `local_extensions` against the config file's folder, so
those paths become absolute; everything else is read relative to the book (the repository root).
"""
import argparse
import os
import pathlib
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # scripts/ (loaded by path too)
from text_files import write_text_atomic

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODES = ("off", "force", "auto", "cache", "inline")


def variant(config, execute):
    """`config` (the parsed _config.yml) with execute_notebooks set and extension paths absolute."""
    if execute not in MODES:
        raise SystemExit(f"--execute must be one of {MODES}, not {execute!r}")
    config = dict(config)
    config["execute"] = {**config.get("execute", {}), "execute_notebooks": execute}
    sphinx = dict(config.get("sphinx", {}))
    sphinx["local_extensions"] = {name: str((ROOT / path).resolve()) for name, path in
                                  (sphinx.get("local_extensions") or {}).items()}
    config["sphinx"] = sphinx
    return config


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--execute", default="off", help=f"one of {MODES} (default off)")
    ap.add_argument("--out", required=True, help="the file to write (its folder is created)")
    args = ap.parse_args(argv)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = ("# Written by scripts/book_config.py from _config.yml: do not edit.\n"
            + yaml.safe_dump(variant(config, args.execute), sort_keys=False))
    write_text_atomic(out, text)   # text_files.py: no torch in the book's venv
    print(f"wrote {out} (execute_notebooks: {args.execute})")


if __name__ == "__main__":
    sys.exit(main())
