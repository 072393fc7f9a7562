"""The book's version from its one source, pyproject.toml: `{{ version }}` in the pages.

pyproject's `version` is the release (tags are `v<version>`, CHANGELOG.md lists them, the set-up
cell of every notebook installs that tag: scripts/colab_setup_cell.py). This puts it into the
MyST substitutions (`{{ version }}`, `{{ release_tag }}`) and Sphinx's `version`/`release`, so the
landing page shows the version a reader is reading, never a typed copy.
"""
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def course_version(root=ROOT):
    """pyproject.toml's [project] version."""
    with open(pathlib.Path(root) / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def add_version(app, config):
    version = course_version()
    config.version = config.release = version
    subs = dict(getattr(config, "myst_substitutions", None) or {})
    subs.update(version=version, release_tag=f"v{version}")
    config.myst_substitutions = subs


def setup(app):
    app.connect("config-inited", add_version, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
