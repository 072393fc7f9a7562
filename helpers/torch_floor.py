"""The oldest torch the course runs on, checked when helpers is imported.

TORCH_FLOOR is pyproject.toml's `torch>=2.11` (tests/test_packaging.py keeps them equal). A
notebook's set-up cell installs helpers with --no-deps where a torch exists (Colab's, Kaggle's),
so an older one is refused here, with the fix, before a chapter fails on an API it lacks.
"""
import re

__all__ = ["TORCH_FLOOR", "validate_torch_version"]

TORCH_FLOOR = (2, 11)


def validate_torch_version(version):
    """Raise ImportError naming the fix if torch `version` ('2.10.1+cu121') is below
    TORCH_FLOOR (major.minor: a 2.11 nightly passes)."""
    m = re.match(r"(\d+)\.(\d+)", str(version))
    if m and (int(m.group(1)), int(m.group(2))) >= TORCH_FLOOR:
        return
    floor = ".".join(map(str, TORCH_FLOOR))
    raise ImportError(f"the course needs torch {floor} or newer, this Python has {version}: run "
                      f"pip install -U 'torch>={floor}', then restart the kernel")


def _validate_installed_torch():
    import torch
    validate_torch_version(torch.__version__)


_validate_installed_torch()
