"""The reader-facing metadata: bibliography labels as the text cites, one version everywhere."""
import importlib.util
import json
import pathlib
import tomllib

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _ext(name):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test",
                                                  ROOT / "book" / "_ext" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _entry(authors, year="2019"):
    from pybtex.database import Entry, Person
    return Entry("article", fields={"year": year, "title": "t"},
                 persons={"author": [Person(a) for a in authors]})


@pytest.mark.parametrize("authors, label", [
    (["Li, Shen"], "Li, 2019"),
    (["Chen, Tianqi", "Xu, Bing"], "Chen and Xu, 2019"),
    (["Huang, Yanping", "Cheng, Youlong", "Bapna, Ankur"], "Huang et al., 2019"),
    (["Sergeev, Alexander", "Del Balso, Mike"], "Sergeev and Del Balso, 2019"),
])
def test_labels_are_author_year(authors, label):
    assert _ext("bib_style").author_year(_entry(authors)) == label


def test_equal_labels_get_letters():
    style = _ext("bib_style").AuthorYearLabels()
    labels = list(style.format_labels([_entry(["Li, A"]), _entry(["Li, B"]), _entry(["Wu, C"])]))
    assert labels == ["Li, 2019a", "Li, 2019b", "Wu, 2019"]


def test_the_course_bibliography_needs_no_letters():
    """sphinxcontrib-bibtex's author-year citation in the text has no a/b suffix: two entries
    with the same authors and year would be cited alike and labelled differently."""
    from pybtex.database import parse_file
    mod = _ext("bib_style")
    entries = parse_file(str(ROOT / "book" / "references.bib")).entries.values()
    labels = [mod.author_year(e) for e in entries]
    assert len(labels) >= 10
    assert len(set(labels)) == len(labels), sorted(labels)


def test_one_version_everywhere():
    """pyproject's version is a release with its CHANGELOG section, or a development version
    between releases ("Unreleased"); CITATION.cff names the newest release, with its date."""
    cv = _ext("course_version")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert cv.course_version() == version
    changelog = (ROOT / "CHANGELOG.md").read_text()
    done = cv.releases()
    assert done, "CHANGELOG.md lists no release (## [X.Y.Z] - YYYY-MM-DD)"
    if cv.is_release(version):
        assert done[0][0] == version, f"CHANGELOG.md's newest release is {done[0][0]}, " \
            f"pyproject's version {version}"
    else:
        assert "## [Unreleased]" in changelog, "a development version needs an Unreleased section"
        newest = tuple(int(x) for x in done[0][0].split("."))
        nxt = tuple(int(x) for x in version.split(".dev")[0].split("."))
        assert nxt > newest, f"{version} is not after the newest release {done[0][0]}"
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert (str(cff["version"]), str(cff["date-released"])) == done[0], \
        "CITATION.cff names the newest release of CHANGELOG.md, with its date"
    intro = (ROOT / "book" / "intro.md").read_text()
    assert "{{ version }}" in intro and "{{ version_note }}" in intro, \
        "the landing page shows the version from pyproject ({{ version }}, {{ version_note }})"


def test_the_version_note_says_release_or_branch(tmp_path):
    cv = _ext("course_version")
    (tmp_path / "CHANGELOG.md").write_text("## [Unreleased]\n\n## [0.1.0] - 2026-12-01\n")
    for version, note in [("0.2.0.dev0", "a development version between releases: the main "
                                         "branch, after release v0.1.0"),
                          ("0.1.0", "release v0.1.0")]:
        (tmp_path / "pyproject.toml").write_text(f'[project]\nversion = "{version}"\n')
        assert cv.version_note(tmp_path) == note


def test_the_landing_page_names_the_gpu_reference_run_from_its_file(tmp_path):
    """{{ gpu_reference }}: the stored run's GPU, torch, date and commit, read from the file, or
    that none is recorded (no file, or a dry run); the landing page quotes it."""
    cv = _ext("course_version")
    assert "{{ gpu_reference }}" in (ROOT / "book" / "intro.md").read_text()
    assert "none is recorded" in cv.gpu_reference_note(tmp_path)
    (tmp_path / "reference").mkdir()
    ref = {"exists": True, "gpu": "G9", "gpu_count": 1, "torch": "2.0", "date": "D",
           "commit": "abc1234", "command": "c"}
    (tmp_path / "reference" / "gpu_reference.json").write_text(json.dumps(ref))
    assert cv.gpu_reference_note(tmp_path) == ("one G9 (torch 2.0, on D, with the course at "
                                               "commit abc1234)")
    (tmp_path / "reference" / "gpu_reference.json").write_text(
        json.dumps(dict(ref, gpu_count=2)))
    assert cv.gpu_reference_note(tmp_path).startswith("2 G9 GPUs (torch 2.0")
    (tmp_path / "reference" / "gpu_reference.json").write_text(
        json.dumps(dict(ref, dry_run=True)))
    assert "none is recorded" in cv.gpu_reference_note(tmp_path)


def test_training_curves_tick_whole_epochs_and_say_which_run():
    """Epochs are whole numbers: no 1.5 on the axis; the title names the run."""
    import matplotlib
    matplotlib.use("Agg")
    from helpers import Animator
    anim = Animator(xlabel="epoch", xlim=[1, 3], legend=["loss"], title="2 devices, lr 0.5")
    for epoch, loss in enumerate((0.9, 0.6, 0.5), start=1):
        anim.add(epoch, loss)
    anim.fig.canvas.draw()
    ticks = [t for t in anim.ax.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert anim.ax.get_title() == "2 devices, lr 0.5"
