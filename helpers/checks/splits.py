"""Checks for the exercises of splits."""
from ._core import expect, run_check  # noqa: F401

__all__ = []
