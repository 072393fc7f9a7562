"""The set-up cell (scripts/colab_setup_cell.py): where it goes in a notebook, what it installs
(the branch between releases, a release its tag), and that it keeps the platform's torch."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
import types
import zipfile

import nbformat
import pytest
import yaml
from colab_emulation import ROOT, _clean_env, _script, _version


# ---------------------------------------------------------------- the set-up cell script
def test_setup_cell_is_inserted_once_under_the_title_and_updated(tmp_path):
    mod = _script()
    path = tmp_path / "nb.ipynb"
    shutil.copy(ROOT / "book" / "part1" / "data_parallel.ipynb", path)
    before = nbformat.read(path, as_version=4)
    assert mod.main([str(path)]) == 0
    once = path.read_text()
    assert mod.main([str(path)]) == 0 and path.read_text() == once, "not idempotent"
    assert mod.main(["--check", str(path)]) == 0
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), \
        "the title comes first"
    cell = nb.cells[1]
    assert cell.id == mod.CELL_ID and cell.cell_type == "code"
    assert cell.metadata["tags"] == ["remove-cell"], "the book must hide the set-up cell"
    assert cell.source.startswith("#@title ") and cell.metadata["cellView"] == "form", \
        "Colab folds it to its title"
    assert cell.metadata["jupyter"]["source_hidden"], "JupyterLab and VS Code fold it"
    others = [c.source for c in before.cells if c.get("id") != mod.CELL_ID]
    assert [c.source for c in nb.cells if c.get("id") != mod.CELL_ID] == others, \
        "the script changed other cells"
    assert all(len(line) <= 79 for line in cell.source.splitlines()), "notebook lines: 79 cols"
    # a stale copy (another ref, moved to the top, with outputs) becomes the fresh cell
    cell.source = cell.source.replace(f'REF = "{mod.release_ref()}"', 'REF = "v0.0.1"')
    cell.outputs = [nbformat.v4.new_output("stream", text="x")]
    nb.cells.insert(0, nb.cells.pop(1))
    nbformat.write(nb, path)
    assert mod.main(["--check", str(path)]) == 1
    assert mod.main([str(path)]) == 0 and path.read_text() == once


def test_setup_cell_installs_the_branch_between_releases_and_a_release_its_tag():
    """main's notebooks must never install an older release's helpers (a Part VII chapter
    failed on a tag made before Part VII): a development version installs the branch."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    mod = _script()
    url = config["repository"]["url"].rstrip("/")
    assert f'"{url}"' in mod.cell_source()
    version = _version()
    want = (f"v{version}" if mod.is_release(version) else config["repository"]["branch"])
    assert mod.release_ref() == want and f'REF = "{want}"' in mod.cell_source()
    assert mod.release_ref(v="0.3.0.dev0") == config["repository"]["branch"]
    assert mod.release_ref(v="0.3.0") == "v0.3.0"
    fork = {"repository": {"url": "https://github.com/someone/fork/", "branch": "dev"}}
    src = mod.cell_source(fork, v="1.2.0.dev1")
    assert '"https://github.com/someone/fork"' in src and 'REF = "dev"' in src
    assert 'REF = "v9.8.7"' in mod.cell_source(fork, v="9.8.7")


class _Recorder:
    """subprocess.run stand-in: records each command."""

    def __init__(self):
        self.calls = []

    def __call__(self, cmd, **kwargs):
        self.calls.append(cmd)
        return types.SimpleNamespace(returncode=0, stdout="", stderr="")


def _run_cell(monkeypatch, recorder, missing=(), shadow=None):
    """Run the cell in this process; `missing`: modules find_spec must not find (as where they
    are not installed); `shadow`: a folder holding another helpers.py, first on sys.path."""
    source = _script().cell_source()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        None if name in missing else real(name, *a)))
    monkeypatch.setattr(subprocess, "run", recorder)
    monkeypatch.delenv("COURSE_REPO", raising=False)
    if shadow:
        monkeypatch.syspath_prepend(str(shadow))
        monkeypatch.delitem(sys.modules, "helpers")
    try:
        exec(source, {})
    finally:
        if shadow:   # monkeypatch puts the course's helpers back
            sys.modules.pop("helpers", None)


def test_setup_cell_does_nothing_where_helpers_imports(monkeypatch):
    """A checkout, Binder, nbval, the book build: helpers imports, nothing is installed."""
    recorder = _Recorder()
    _run_cell(monkeypatch, recorder)
    assert recorder.calls == []


def test_setup_cell_installs_what_it_names_keeping_the_platforms_torch(monkeypatch):
    mod = _script()
    url = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["url"].rstrip("/")
    target = f"git+{url}@{mod.release_ref()}"
    platform = _Recorder()   # Colab, Kaggle: torch is there
    _run_cell(monkeypatch, platform, missing={"helpers"})
    deps, package = platform.calls
    assert deps[1:4] == ["-m", "pip", "install"] and set(mod.install_deps()) <= set(deps)
    assert not any(d.startswith(("torch", "git+")) for d in deps), deps
    assert package[-2:] == ["--no-deps", target], package
    bare = _Recorder()       # a Jupyter without torch: everything from the index
    _run_cell(monkeypatch, bare, missing={"helpers", "torch"})
    assert len(bare.calls) == 1 and bare.calls[0][-1] == target
    assert "--no-deps" not in bare.calls[0]


def test_setup_cell_stops_on_another_module_named_helpers(monkeypatch, tmp_path):
    """A reader's helpers.py beside the notebook: no install, no AttributeError three cells
    later, but one line naming the file and the fix."""
    (tmp_path / "helpers.py").write_text("def mine():\n    return 1\n")
    recorder = _Recorder()
    with pytest.raises(SystemExit) as stop:
        _run_cell(monkeypatch, recorder, shadow=tmp_path)
    text = str(stop.value)
    assert str(tmp_path / "helpers.py") in text and "rename it" in text and "\n" not in text
    assert recorder.calls == [], "a shadowing module is reported, not installed over"


def _fake_wheel(where, name, version, requires=()):
    """A wheel with metadata only (what pip's resolver reads), no code."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    path = where / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    files = {f"{info}/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
                 name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)),
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


def test_pip_would_replace_an_older_torch_but_the_cell_keeps_it(monkeypatch, tmp_path):
    """The package asks for torch>=2.11. Where a platform has an older torch (Kaggle lags), a
    plain `pip install` of the package replaces it (a multi-GB download, maybe for another CUDA);
    the commands the cell runs leave it. pip resolves (--dry-run) against wheels that carry
    metadata only: an old torch installed, newer ones and the other dependencies on offer."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    old = _fake_wheel(wheels, "torch", "2.0.0")
    for name, version in [("torch", "99.0.0"), ("torchvision", "99.0.0"),
                          ("matplotlib", "99.0.0"), ("tqdm", "99.0.0")]:
        _fake_wheel(wheels, name, version)
    _fake_wheel(wheels, project["name"], project["version"], project["dependencies"])
    venv = tmp_path / "platform"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # pip as it comes: no machine's pip.conf, constraints or extra wheel folders
    env = {k: v for k, v in _clean_env().items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    offline = ["--no-index", "--find-links", str(wheels), "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--quiet", *offline, str(old)], check=True, env=env)

    def would_install(args):
        report = tmp_path / "report.json"
        subprocess.run([*pip, "install", "--quiet", "--dry-run", "--report", str(report),
                        *offline, *args], check=True, env=env)
        return {i["metadata"]["name"]: i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]}

    assert would_install([project["name"]]).get("torch") == "99.0.0", \
        "a plain install no longer replaces an older torch: the cell's care may go"
    recorder = _Recorder()
    _run_cell(monkeypatch, recorder, missing={"helpers"})
    monkeypatch.undo()   # subprocess.run itself again
    replaced = {}
    for cmd in recorder.calls:   # the cell's commands, its package from the wheels here
        assert cmd[1:4] == ["-m", "pip", "install"], cmd
        args = [project["name"] if a.startswith("git+") else a for a in cmd[4:]
                if a != "--quiet"]
        replaced.update(would_install(args))
    assert project["name"] in replaced and "torch" not in replaced, replaced
