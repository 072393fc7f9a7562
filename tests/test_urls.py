"""The repository's address lives in one place (_config.yml repository.url): every link follows it,
and no placeholder or dead address (hub.example.org, ...) is left in the repository."""
import importlib.util
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PLACEHOLDER = re.compile(r"https?://[\w.-]*example\.(org|com|net)|hub\.example|YOUR[_-]?(ORG|USER)"
                         r"|your-org/", re.I)
FIXTURES = {"tests/browser/test_checks_fail.py", "tests/test_urls.py"}   # pages built to fail


def _sync():
    spec = importlib.util.spec_from_file_location("sync_urls", ROOT / "scripts" / "sync_urls.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tracked_text_files():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        pytest.skip("not a git checkout")
    for rel in out.stdout.splitlines():
        p = ROOT / rel
        if rel in FIXTURES or rel.startswith("book/_vendor/") or not p.is_file():
            continue
        try:
            yield rel, p.read_text()
        except UnicodeDecodeError:
            continue


def test_no_placeholder_address_is_left():
    bad = [f"{rel}: {m.group(0)}" for rel, text in _tracked_text_files()
           for m in PLACEHOLDER.finditer(text)]
    assert not bad, "placeholder or dead addresses:\n  " + "\n  ".join(bad)


def test_every_link_follows_the_configured_repository():
    sync = _sync()
    owner, repo, _ = sync.configured()
    assert sync.recorded() == (owner, repo), \
        "pyproject's URLs do not follow _config.yml: run scripts/sync_urls.py"
    assert sync.main(["--check"]) == 0
    ours = {f"{owner}/{repo}".lower()}
    for rel in sync.FILES:
        text = (ROOT / rel).read_text()
        found = {m.lower() for m in re.findall(r"github\.com/([\w.-]+/[\w.-]+?)(?=[/\s)\"'>]|$)",
                                               text)}
        assert found and found <= ours, f"{rel} links to {found - ours} instead of {ours}"


def test_sync_rewrites_a_fork(tmp_path):
    text = ("https://github.com/a/b and https://a.github.io/b/ and "
            "https://colab.research.google.com/github/a/b/blob/main/x.ipynb "
            "https://mybinder.org/v2/gh/a/b/main and github.com/a/bc stays")
    new = _sync().rewrite(text, ("a", "b"), ("Me", "fork"), "dev")
    assert new == ("https://github.com/Me/fork and https://me.github.io/fork/ and "
                   "https://colab.research.google.com/github/Me/fork/blob/dev/x.ipynb "
                   "https://mybinder.org/v2/gh/Me/fork/dev and github.com/a/bc stays")


def test_no_dead_jupyterhub_button():
    import yaml
    launch = yaml.safe_load((ROOT / "_config.yml").read_text())["launch_buttons"]
    hub = launch.get("jupyterhub_url") or ""
    assert not PLACEHOLDER.search(hub), f"jupyterhub_url {hub!r} is a placeholder: remove it"
