"""Which files make up the book: read from _toc.yml (shared by tests and scripts)."""
import pathlib

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
SKIP_PARTS = {"_build", ".ipynb_checkpoints"}


def toc_entries():
    """Every `file:` in _toc.yml (root included), as paths without suffix, relative to ROOT."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    entries = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                entries.append(node["file"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(toc.get("parts", []))
    return [e.removesuffix(".ipynb").removesuffix(".md") for e in entries]


def entry_path(entry):
    """The file behind a toc entry (.ipynb or .md)."""
    for suffix in (".ipynb", ".md"):
        p = ROOT / (entry + suffix)
        if p.exists():
            return p
    raise FileNotFoundError(
        f"_toc.yml lists {entry!r} but neither {entry}.ipynb nor {entry}.md exists")


def toc_notebooks():
    return [p for p in map(entry_path, toc_entries()) if p.suffix == ".ipynb"]


def book_sources():
    """Every notebook and page under book/ (what must appear in the toc)."""
    return sorted(p for p in (ROOT / "book").rglob("*")
                  if p.suffix in (".ipynb", ".md") and not SKIP_PARTS & set(p.parts))


def toc_parts():
    """[(caption, [entry, ...])] of _toc.yml's parts, in order (the root page is in none)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [(part["caption"], [c["file"].removesuffix(".ipynb").removesuffix(".md")
                               for c in part.get("chapters", [])])
            for part in toc.get("parts", [])]


def helpers_names(nb):
    """The names a notebook's code takes from the top of helpers: helpers.X, from helpers
    import X."""
    import ast
    names = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse("\n".join(ln for ln in cell.source.splitlines()
                                       if not ln.lstrip().startswith(("%", "!"))))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "helpers":
                names.add(node.attr)
            elif isinstance(node, ast.ImportFrom) and node.module == "helpers":
                names |= {a.name for a in node.names}
    return names
