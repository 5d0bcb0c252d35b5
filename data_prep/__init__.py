"""Download the official datasets and build their folders: ``capo data prepare NAME``.

One module per domain (``qa``, ``alfworld``, ``webshop``, ``papers``), each with the entry points that
``data_prep.domains`` lists; ``prepare``, ``data_info``, ``verify`` and ``is_prepared`` here dispatch a
dataset name to its domain. Imported lazily, so ``data_prep.progress`` costs no domain import.
"""

from __future__ import annotations

__all__ = ["DATASETS", "data_info", "is_prepared", "prepare", "verify"]


def __getattr__(name: str):
    if name == "DATASETS":
        from .domains import domains

        return tuple(domains())
    if name in ("data_info", "is_prepared", "prepare", "verify"):
        from . import domains

        return getattr(domains, name)
    raise AttributeError(f"module 'data_prep' has no attribute {name!r}")
