"""The book's table of contents and notebooks are consistent (no kernel needed)."""
import json

import pytest

from book_files import ROOT, book_sources, entry_path, toc_entries, toc_notebooks


def test_every_book_file_is_in_the_toc():
    listed = {entry_path(e) for e in toc_entries()}
    missing = [str(p.relative_to(ROOT)) for p in book_sources() if p not in listed]
    assert not missing, f"add these to _toc.yml, or the book never shows them: {missing}"


def test_every_toc_entry_exists():
    for entry in toc_entries():
        entry_path(entry)   # raises with the entry's name


@pytest.mark.parametrize("path", toc_notebooks(), ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_metadata(path):
    nb = json.loads(path.read_text())
    assert nb["metadata"].get("kernelspec", {}).get("name", "python3") == "python3", \
        "both nbval and the book build run the python3 kernel"
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", f"cell {i} has a stored error output"
