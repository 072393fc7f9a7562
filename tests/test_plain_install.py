"""The files a plain install ships (helpers.script_path, helpers.paths.course_file): a wheel
holds what the chapters read, and helpers finds it there, not in a checkout."""
import pathlib
import subprocess
import sys
import zipfile

import pytest
from colab_emulation import ROOT, _clean_env, _package_copy


# ---------------------------------------------------------------- files a plain install ships
def test_script_path_in_a_checkout():
    import helpers
    assert helpers.script_path("torchrun.py") == (ROOT / "scripts/ddp/torchrun.py").resolve()
    assert helpers.script_path("bench.py", folder="") == (ROOT / "scripts/bench.py").resolve()
    assert helpers.paths.course_file("gpu_reference.json") == \
        (ROOT / "reference/gpu_reference.json").resolve()
    with pytest.raises(FileNotFoundError, match="no_such_script.py"):
        helpers.script_path("no_such_script.py")




def test_a_plain_install_ships_what_the_chapters_read(tmp_path):
    """A wheel (what `pip install git+...` builds) holds every package of helpers/, the scripts
    the chapters run and the GPU reference run; helpers finds them there, not in a checkout."""
    src = _package_copy(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, env=_clean_env())
    wheel, = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {p.relative_to(ROOT).as_posix() for p in (ROOT / "helpers").rglob("__init__.py")}
    want |= {f"helpers/_scripts/ddp/{p.name}" for p in (ROOT / "scripts/ddp").glob("*.py")}
    want |= {"helpers/_scripts/bench.py", "helpers/_reference/gpu_reference.json"}
    assert want <= names, f"{wheel.name} lacks {sorted(want - names)} (pyproject.toml)"
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(site), str(wheel)], check=True, env=_clean_env())
    probe = ("import helpers; print(helpers.script_path('torchrun.py')); "
             "print(helpers.script_path('bench.py', folder='')); "
             "print(helpers.paths.course_file('gpu_reference.json')); "
             "print(helpers.data.data_dir())")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, check=True, env=_clean_env(PYTHONPATH=str(site),
                                                               HOME=str(tmp_path))).stdout
    torchrun, bench, reference, data = map(pathlib.Path, out.split())
    assert torchrun == (site / "helpers/_scripts/ddp/torchrun.py").resolve()
    assert bench == (site / "helpers/_scripts/bench.py").resolve()
    assert reference == (site / "helpers/_reference/gpu_reference.json").resolve()
    assert data == tmp_path / ".cache/multigpu-course/data"
