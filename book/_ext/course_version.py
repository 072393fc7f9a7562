"""The book's version from its one source, pyproject.toml: `{{ version }}` in the pages.

pyproject's `version` is a release (`0.2.0`: tag `v0.2.0`, the notebooks' set-up cells install
that tag) or, between releases, a development version (`0.3.0.dev0`, PEP 440: the cells install
the branch; scripts/colab_setup_cell.py). CHANGELOG.md lists the releases. This puts the
version into the MyST substitutions (`{{ version }}`; `{{ version_note }}`, which says which
release or branch it is; `{{ release_tag }}`, the newest release's tag) and Sphinx's
`version`/`release`, so the landing page shows the version a reader is reading, never a typed
copy. `{{ gpu_reference }}` names the committed GPU reference run (reference/gpu_reference.json)
the same way: its GPU, torch, date and commit, read from the file.
"""
import json
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


def gpu_reference_note(root=ROOT):
    """'one NVIDIA H200 (torch 2.11.0+cu130, on 2026-12-04 13:33 UTC, with the course at commit
    05c8a0a)' from reference/gpu_reference.json, or what stands where no GPU run is recorded."""
    path = pathlib.Path(root) / "reference" / "gpu_reference.json"
    ref = json.loads(path.read_text()) if path.exists() else {}
    if not ref.get("exists") or ref.get("dry_run"):
        return "a GPU machine (none is recorded yet: the file says so)"
    count = ref.get("gpu_count") or 1
    gpus = f"one {ref['gpu']}" if count == 1 else f"{count} {ref['gpu']} GPUs"
    return (f"{gpus} (torch {ref['torch']}, on {ref['date']}, with the course at commit "
            f"{ref.get('commit', 'unknown')})")


def add_version(app, config):
    version = course_version()
    config.version = config.release = version
    branch = ((getattr(config, "html_theme_options", None) or {}).get("repository_branch")
              or "main")
    done = releases()
    subs = dict(getattr(config, "myst_substitutions", None) or {})
    subs.update(version=version, version_note=version_note(branch=branch),
                release_tag=f"v{version}" if is_release(version) or not done
                else f"v{done[0][0]}", gpu_reference=gpu_reference_note())
    config.myst_substitutions = subs


def setup(app):
    app.connect("config-inited", add_version, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
