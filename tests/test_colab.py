"""Notebooks run in an emulated Colab and Kaggle after their set-up cell (the cell itself:
test_colab_setup_cell.py; what a plain install ships: test_plain_install.py; the venv and the
course's repository: colab_emulation.py).

The emulations: a venv with only what those platforms preinstall (torch, torchvision, matplotlib,
ipywidgets, tqdm, ipykernel; nbclient/nbformat to run the notebook), no course package; the
platform's markers (Colab: the `google.colab` module imported at kernel start, its environment
variables, /content as the working folder; Kaggle: KAGGLE_KERNEL_RUN_TYPE and friends,
/kaggle/working); a fresh home folder whose ~/.cache/multigpu-course/data holds Fashion-MNIST
(where a plain install looks for it). The course's "repository" is a local git repository
(COURSE_REPO points the cell at it; no network: pip may not use an index, and builds without
isolation from the venv's setuptools) holding the package at the ref the set-up cell names:
the branch (this checkout's package: what the branch holds once it is committed), or a release's
tag (that tag's package from this repository's history; this checkout's only while the tag is
not made yet, a release commit being tested before `git tag`). One Colab session (one install,
one kernel) runs a Part I chapter whole, then one notebook of every Part its first cells
against that install; Kaggle runs the torchrun chapter through its first training run, whose
ranks are new interpreters started by torchrun: they import helpers only if the install is
visible to every process, and run the DDP scripts the package ships. The venv is cached in
_build/colab-venv (first run about a minute).
"""
import json
import os
import pathlib
import shutil
import subprocess

import nbformat
import pytest
from book_files import helpers_names, toc_notebooks, toc_parts
from colab_emulation import ROOT, VENV, _clean_env, _course_repository, _platform_venv, _script

# ---------------------------------------------------------------- Colab and Kaggle, emulated
RUNNER = r"""
import json, sys
import nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=900, kernel_name="python3", allow_errors=True,
               resources={"metadata": {"path": sys.argv[2]}}).execute()
errors = [f"{c.metadata.get('from', 'cell')} {i}: {o.get('ename')}: {o.get('evalue')}"
          for i, c in enumerate(nb.cells) if c.cell_type == "code"
          for o in c.get("outputs", []) if o.get("output_type") == "error"
          and "raises-exception" not in c.metadata.get("tags", [])]
text = lambda c: "".join(o.get("text", "") for o in c.get("outputs", []))
setup = [text(c) for c in nb.cells if c.get("id") == "course-setup"]
print(json.dumps({"errors": errors, "setup": setup, "probe": text(nb.cells[-1])}))
"""

PROBE = ("import sys, helpers\nprint(sys.executable)\nprint(helpers.__file__)\n"
         "print(helpers.data.data_dir())\nprint('google.colab' in sys.modules)")


def _data_source():
    data = pathlib.Path(os.environ.get("COURSE_DATA") or ROOT / "data")
    if not (data / "FashionMNIST").is_dir():
        pytest.skip(f"no Fashion-MNIST in {data} (set COURSE_DATA)")
    return data


PLATFORMS = {
    # Colab: its kernel has imported google.colab; /content is the working folder
    "colab": dict(notebook="book/part1/data_parallel.ipynb", cwd="content",
                  env=dict(COLAB_RELEASE_TAG="release-colab-emulated", COLAB_GPU="",
                           COLAB_JUPYTER_IP="172.28.0.12")),
    # Kaggle: what its docker image sets; /kaggle/working is the working (and output) folder.
    # The chapter up to its first training run under torchrun and the load of the model it saved
    # (what a fresh interpreter per rank needs; the later sections launch the same way). Not
    # the launch of minimal.py, which imports torch alone (tests/test_distributed.py runs it):
    # it tests the platform's torch, not the install; nor single.py and spawn.py with the cell
    # that compares their logs: fresh interpreters running a script of the install by path, as
    # the torchrun launch does (about 10 s of CPU on a 2-core machine, 3 more processes)
    "kaggle": dict(notebook="book/part3/ddp_torchrun.ipynb", cwd="kaggle/working",
                   through="load_state_dict(torch.load(workdir",
                   skip=('str(SCRIPTS / "minimal.py"), "--steps"',
                         'for script, extra in (("single.py", [])',
                         'one, two = losses["single.py"], losses["spawn.py"]'),
                   env=dict(KAGGLE_KERNEL_RUN_TYPE="Interactive",
                            KAGGLE_URL_BASE="https://www.kaggle.com",
                            KAGGLE_DOCKER_IMAGE="gcr.io/kaggle-gpu-images/python",
                            KAGGLE_DATA_PROXY_PROJECT="kaggle-emulated")),
}


def _emulate(name, tmp_path):
    """Paths and environment of a fresh machine of platform `name`."""
    spec = PLATFORMS[name]
    home, cwd = tmp_path / "home", tmp_path / spec["cwd"]
    cwd.mkdir(parents=True)
    cache = home / ".cache" / "multigpu-course"
    cache.mkdir(parents=True)
    (cache / "data").symlink_to(_data_source())   # where a plain install keeps the data
    env = _clean_env(HOME=str(home), COURSE_QUICK="1", PIP_NO_INDEX="1",
                     PIP_NO_BUILD_ISOLATION="0", PIP_DISABLE_PIP_VERSION_CHECK="1",
                     MPLCONFIGDIR=str(ROOT / "_build" / "colab-mpl"), **spec["env"],
                     PATH=f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                     JUPYTER_PATH=str(VENV / "share" / "jupyter"))
    if name == "colab":
        stub = tmp_path / "colab-env" / "google" / "colab"
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text('"""Stands in for Colab\'s module."""\n')
        startup = home / ".ipython" / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-colab.py").write_text("import google.colab  # noqa: F401\n")
        env["PYTHONPATH"] = str(tmp_path / "colab-env")
    else:
        (tmp_path / "kaggle" / "input").mkdir()
    return spec, cwd, env


def _chapter_cells(entry, cwd, through=None, first=None, label=None, skip=None):
    """`entry`'s cells as a reader opening it gets them: its set-up cell written by the script,
    then every cell up to the one holding `through` (or its first `first` code cells after the
    set-up cell), less the code cells holding each of `skip` (one cell each); `label`: names the
    cells' chapter in errors."""
    path = cwd / f"{pathlib.Path(entry).name}.ipynb"   # downloaded or opened alone: a lone file
    shutil.copy(ROOT / f"{entry}.ipynb", path)
    assert _script().main([str(path)]) == 0
    cells = nbformat.read(path, as_version=4).cells
    if through:
        last = [i for i, c in enumerate(cells) if c.cell_type == "code" and through in c.source]
        assert last, f"no cell of {entry} has {through!r}: update PLATFORMS"
        cells = cells[:last[0] + 1]
    for marker in skip or ():
        left = [c for c in cells if not (c.cell_type == "code" and marker in c.source)]
        assert len(left) == len(cells) - 1, \
            f"no one cell of {entry} has {marker!r}: update PLATFORMS"
        cells = left
    if first is not None:
        cells = [c for c in cells if c.cell_type == "code"]
        assert cells[0].get("id") == _script().CELL_ID
        cells = cells[:1 + first]
    if label:
        for c in cells:
            c.metadata["from"] = label
    return cells


def _run_emulated(platform, tmp_path, cells):
    """Run `cells` and a last probe cell in one kernel of an emulated `platform` whose course
    package is installed by the first set-up cell only. The run's result (errors, the set-up
    cell's output, the probe's), the platform's Python and the notebook's environment."""
    py = _platform_venv()
    spec, cwd, env = _emulate(platform, tmp_path)
    probe = subprocess.run([str(py), "-c", "import helpers"], env=env, cwd=cwd,
                           capture_output=True)
    assert probe.returncode != 0, "the venv already has helpers: the test would prove nothing"
    env["COURSE_REPO"] = _course_repository(tmp_path / "github",
                                            _script().release_ref()).as_uri()
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3",
                                                          "display_name": "Python 3"}})
    nb.cells = cells(cwd)
    nb.cells.append(nbformat.v4.new_code_cell(
        PROBE + "\nimport json, pkgutil\nprint(json.dumps(sorted(set(dir(helpers)) | {m.name for m "
        "in pkgutil.iter_modules(helpers.__path__)})))"))
    nb_path = cwd / "run.ipynb"
    nbformat.write(nb, nb_path)
    run = subprocess.run([str(py), "-c", RUNNER, str(nb_path), str(cwd)], env=env, cwd=cwd,
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1]), py


def _assert_ran_on(platform, result, py, tmp_path):
    assert not result["errors"], f"on emulated {platform}:\n  " + "\n  ".join(result["errors"])
    kernel_python, helpers_file, data, colab = result["probe"].split("\n")[:4]
    assert pathlib.Path(kernel_python).parent == py.parent, \
        f"the notebook ran in {kernel_python}, not the emulated {platform}'s {py}"
    assert pathlib.Path(helpers_file).is_relative_to(VENV), \
        f"helpers came from {helpers_file}, not from the install into the environment"
    assert data == str(tmp_path / "home/.cache/multigpu-course/data")
    assert colab == str(platform == "colab"), "the platform's markers are not emulated"
    assert result["setup"] == [""], f"the set-up cell printed {result['setup']}"
    # a fresh interpreter of the platform finds it in the environment (the kernel imported it
    # above: finding it is enough, without importing torch once more)
    where = subprocess.run([str(py), "-c", "import importlib.util as u; "
                            "print(getattr(u.find_spec('helpers'), 'origin', None))"],
                           env=_clean_env(), cwd=tmp_path, capture_output=True, text=True)
    assert where.returncode == 0 and pathlib.Path(where.stdout.strip()).is_relative_to(VENV), \
        f"the set-up cell did not install helpers into the environment: {where.stdout}"


FIRST_CELLS = 2   # code cells of each Part's notebook after its set-up cell: imports, first use


def _one_notebook_per_part():
    """The first notebook of each Part of _toc.yml (where a reader of the Part starts)."""
    found = []
    for caption, entries in toc_parts():
        notebooks = [e for e in entries if (ROOT / f"{e}.ipynb").is_file()]
        if notebooks:
            found.append((caption, notebooks[0]))
    return found


@pytest.fixture(scope="module")
def colab_session(tmp_path_factory):
    """One emulated Colab session (one install, one kernel): the Part I chapter whole, its
    set-up cell installing helpers, then, as a reader opening one chapter after another, each
    Part's first notebook's set-up cell and first code cells."""
    tmp_path = tmp_path_factory.mktemp("colab")
    parts = _one_notebook_per_part()
    assert len(parts) >= 8, parts

    def cells(cwd):
        out = _chapter_cells(PLATFORMS["colab"]["notebook"].removesuffix(".ipynb"), cwd)
        for caption, entry in parts:
            for c in _chapter_cells(entry, cwd, first=FIRST_CELLS,
                                    label=f"{entry}.ipynb ({caption})"):
                c["id"] = f"{len(out)}-{c.get('id')}"[:64]   # unique in the one notebook
                out.append(c)
        return out
    result, py = _run_emulated("colab", tmp_path, cells)
    return result, py, tmp_path


def test_a_chapter_runs_on_colab_after_the_setup_cell(colab_session):
    result, py, tmp_path = colab_session
    _assert_ran_on("colab", result, py, tmp_path)


def test_a_chapter_runs_on_kaggle_after_the_setup_cell(tmp_path):
    spec = PLATFORMS["kaggle"]
    result, py = _run_emulated("kaggle", tmp_path, lambda cwd: _chapter_cells(
        spec["notebook"].removesuffix(".ipynb"), cwd, through=spec["through"], skip=spec["skip"]))
    _assert_ran_on("kaggle", result, py, tmp_path)


def test_one_notebook_of_every_part_runs_against_the_helpers_its_cell_installs(colab_session):
    """A notebook opened from the repository installs what its set-up cell names; a Part whose
    chapters use a name that helpers lacks there fails here (a Part VII chapter once met
    `AttributeError: module 'helpers' has no attribute 'rank_grid'` on an older tag). The
    Colab session runs, in turn, each Part's set-up cell and first code cells (as a reader
    opening one chapter after another), and every name any chapter takes from helpers
    (`helpers.X`, `from helpers import X`) must exist in that install: a name of the façade or
    a module of the package."""
    result, _, _ = colab_session
    assert not result["errors"], "on emulated Colab, with the helpers the cells install:\n  " + \
        "\n  ".join(result["errors"])
    lines = result["probe"].splitlines()
    assert pathlib.Path(lines[1]).is_relative_to(VENV), f"helpers came from {lines[1]}"
    have = set(json.loads(lines[-1]))
    lacking = {}
    for path in toc_notebooks():
        for name in helpers_names(nbformat.read(path, as_version=4)) - have:
            lacking.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    assert not lacking, f"the helpers the cells install lack {lacking}"


def test_the_names_check_sees_a_missing_name():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import helpers\nfrom helpers import (a, b)\n"
                                          "helpers.rank_grid((2, 2))\n%time x = 1")]
    assert helpers_names(nb) == {"a", "b", "rank_grid"}


def test_every_notebook_has_the_setup_cell():
    """Fails until `python scripts/colab_setup_cell.py` has been run over the notebooks (and
    after a change of the cell, of pyproject's version or of _config.yml's repository)."""
    assert _script().main(["--check"]) == 0, "run: python scripts/colab_setup_cell.py"
