"""Make every link to the repository follow `repository.url` in _config.yml (the one place).

Usage: python scripts/sync_urls.py [--check]
The launch buttons read _config.yml themselves. This rewrites the other places: README.md,
pyproject.toml ([project.urls]), CITATION.cff and .github/workflows (github.com/OWNER/REPO,
OWNER.github.io/REPO, Colab and Binder links, the branch in them), then the notebooks' Colab
set-up cells (scripts/colab_setup_cell.py). The old address is read from pyproject's Source URL.
`--check` changes nothing and exits 1 naming the files that disagree (tests/test_urls.py).
"""
import argparse
import pathlib
import re
import subprocess
import sys
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = ["README.md", "pyproject.toml", "CITATION.cff"]


def _write(path, text):
    """`text` into `path` with the course's atomic writer: a kill leaves the old file whole."""
    sys.path.insert(0, str(ROOT))
    from helpers import atomic_write
    atomic_write(path, lambda f: f.write(text), mode="w")


def configured():
    """(owner, repo, branch) of _config.yml's repository.url."""
    repo = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    m = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?", repo["url"])
    if not m:
        raise SystemExit(f"_config.yml repository.url {repo['url']!r} is not "
                         "https://github.com/OWNER/REPO")
    return m.group(1), m.group(2), repo.get("branch", "main")


def recorded():
    """(owner, repo) the files were last synced to: pyproject's [project.urls] Source."""
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    m = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+)", urls["Source"])
    return m.group(1), m.group(2)


def rewrite(text, old, new, branch):
    (o, r), (no, nr) = old, new
    text = re.sub(rf"(github\.com/|colab\.research\.google\.com/github/|mybinder\.org/v2/gh/)"
                  rf"{re.escape(o)}/{re.escape(r)}\b", rf"\g<1>{no}/{nr}", text)
    text = re.sub(rf"\b{re.escape(o)}\.github\.io/{re.escape(r)}\b", f"{no.lower()}.github.io/{nr}",
                  text)
    text = re.sub(rf"(colab\.research\.google\.com/github/{re.escape(no)}/{re.escape(nr)}/blob/)"
                  r"[\w.-]+/", rf"\g<1>{branch}/", text)
    text = re.sub(rf"(mybinder\.org/v2/gh/{re.escape(no)}/{re.escape(nr)}/)[\w.-]+",
                  rf"\g<1>{branch}", text)
    return text


def stale_setup_cells():
    """Notebooks whose Colab set-up cell (where they have one) names another repository."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import nbformat
    from colab_setup_cell import CELL_ID, cell_source, toc_notebooks
    want = cell_source()
    return [str(p.relative_to(ROOT)) for p in toc_notebooks()
            for c in nbformat.read(p, as_version=4).cells
            if c.get("id") == CELL_ID and c.source != want]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    owner, repo, branch = configured()
    old = recorded()
    stale = []
    files = FILES + sorted(str(p.relative_to(ROOT)) for p in (ROOT / ".github").rglob("*.yml"))
    for rel in files:
        path = ROOT / rel
        text = path.read_text()
        new = rewrite(text, old, (owner, repo), branch)
        if new != text:
            stale.append(rel)
            if not args.check:
                _write(path, new)
    cells = [sys.executable, str(ROOT / "scripts" / "colab_setup_cell.py")]
    if args.check:
        stale += stale_setup_cells()
        if stale:
            print("not following _config.yml's repository.url (run scripts/sync_urls.py):",
                  *stale, sep="\n  ")
            return 1
        return 0
    subprocess.run(cells, check=True)
    print(f"links follow https://github.com/{owner}/{repo} (branch {branch}):",
          ", ".join(stale) or "nothing to change")
    return 0


if __name__ == "__main__":
    sys.exit(main())
