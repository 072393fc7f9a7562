"""The front matter tells the whole course: every Part of _toc.yml is on the landing page's
"What you will learn" list (hand-written, in the book's order), in its learning path
(generated: book/_ext/learning_path.py), in the README's list of Parts and in the changelog."""
import importlib.util
import re

from book_files import ROOT, toc_parts

PATH_SKIP = {"For teachers", "Reference"}


def _path_parts():
    return [(c, e) for c, e in toc_parts() if c not in PATH_SKIP]


def _numbered():
    """(roman numeral, caption) of the captions "Part VII: ..."."""
    return [(m.group(1), c) for c, _ in _path_parts() if (m := re.match(r"Part ([IVX]+):", c))]


def test_what_you_will_learn_has_every_part_in_order():
    intro = (ROOT / "book" / "intro.md").read_text()
    section = intro.split("## What you will learn", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"^- \*\*Part ([IVX]+),", section, re.M)
    assert found == [n for n, _ in _numbered()], \
        f"book/intro.md lists Parts {found}; _toc.yml has {[n for n, _ in _numbered()]}"


def test_the_learning_path_is_generated_from_the_toc():
    intro = (ROOT / "book" / "intro.md").read_text()
    assert "```{learning-path}" in intro.split("## The learning path", 1)[1]
    spec = importlib.util.spec_from_file_location("learning_path",
                                                  ROOT / "book" / "_ext" / "learning_path.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.parts(ROOT) == _path_parts()


def test_the_readme_lists_every_part():
    readme = (ROOT / "README.md").read_text()
    listed = re.findall(r"^- (.+)$", readme.split("The Parts (", 1)[1].split("\n\n", 2)[1], re.M)
    assert listed == [c for c, _ in _path_parts()], \
        "README.md's list of Parts differs from _toc.yml's captions"


def test_the_changelog_names_every_part():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    missing = [n for n, _ in _numbered() if not re.search(rf"\bPart {n}\b", changelog)]
    assert not missing, f"CHANGELOG.md never names Part {missing}"


def test_the_teachers_guide_covers_every_chapter_in_order():
    """Its "What each chapter teaches" table has one row per chapter notebook of _toc.yml, in the
    book's order, and its pitfalls table names a chapter of every Part."""
    from book_files import toc_entries

    text = (ROOT / "book" / "teachers.md").read_text()
    teaches = text.split("## What each chapter teaches", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| \{doc\}`([^`]+)` \|", teaches, re.M)
    chapters = [e.removeprefix("book/") for e in toc_entries()
                if (ROOT / (e + ".ipynb")).exists()]
    assert rows == chapters, "book/teachers.md's objectives table differs from _toc.yml's chapters"
    pitfalls = text.split("## What students get wrong", 1)[1].split("\n## ", 1)[0]
    folders = {m.split("/")[0] for m in re.findall(r"\{doc\}`([^`]+)`", pitfalls)}
    parts = {c.split("/")[0] for c in chapters if "/" in c}
    assert parts <= folders, f"no pitfall points into {sorted(parts - folders)}"


def test_every_python_floor_in_the_prose_is_pyprojects():
    """"Python 3.N or newer" anywhere in the Markdown and notebooks says pyproject's floor."""
    import tomllib

    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    floor = spec.removeprefix(">=").strip()
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "book").rglob("*.md"),
             *(ROOT / "book").rglob("*.ipynb")]
    said = {(f.name, m) for f in files if f.exists()
            for m in re.findall(r"Python (3\.\d+)\+? or (?:newer|later)", f.read_text())}
    assert said and all(m == floor for _, m in said), sorted(said)
