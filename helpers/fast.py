"""(work in progress)"""
__all__ = []
