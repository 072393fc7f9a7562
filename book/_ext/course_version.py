"""The book's version from its one source, pyproject.toml: `{{ version }}` in the pages.

pyproject's `version` is a release (`0.2.0`: tag `v0.2.0`, the notebooks' set-up cells install
that tag) or, between releases, a development version (`0.3.0.dev0`, PEP 440: the cells install
the branch; scripts/colab_setup_cell.py). CHANGELOG.md lists the releases. This puts the
version into the MyST substitutions (`{{ version }}`; `{{ version_note }}`, which says which
release or branch it is; `{{ release_tag }}`, the newest release's tag) and Sphinx's
`version`/`release`, so the landing page shows the version a reader is reading, never a typed
copy.
"""
import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def course_version(root=ROOT):
    """pyproject.toml's [project] version."""
    with open(pathlib.Path(root) / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def is_release(version):
    """`0.2.0` is a release; `0.2.0.dev0` (PEP 440's development release) is not."""
    return re.search(r"\.dev\d*$", version) is None


def releases(root=ROOT):
    """[(version, date)] of CHANGELOG.md's release sections (`## [0.1.0] - 2026-12-01`), newest
    first."""
    text = (pathlib.Path(root) / "CHANGELOG.md").read_text()
    return re.findall(r"^## \[(\d[^\]]*)\] - (\d{4}-\d{2}-\d{2})$", text, re.M)


def version_note(root=ROOT, branch="main"):
    """'release v0.2.0', or 'a development version between releases: the main branch, after
    release v0.1.0'."""
    version = course_version(root)
    if is_release(version):
        return f"release v{version}"
    done = releases(root)
    after = f", after release v{done[0][0]}" if done else ""
    return f"a development version between releases: the {branch} branch{after}"


def add_version(app, config):
    version = course_version()
    config.version = config.release = version
    branch = ((getattr(config, "html_theme_options", None) or {}).get("repository_branch")
              or "main")
    done = releases()
    subs = dict(getattr(config, "myst_substitutions", None) or {})
    subs.update(version=version, version_note=version_note(branch=branch),
                release_tag=f"v{version}" if is_release(version) or not done
                else f"v{done[0][0]}")
    config.myst_substitutions = subs


def setup(app):
    app.connect("config-inited", add_version, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
