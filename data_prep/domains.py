"""The table of data steps: one module per domain, each with the same entry points.

A domain module (``data_prep.qa``, ``.alfworld``, ``.webshop``, ``.papers``) exposes:

* ``DATASETS``: the names ``capo data prepare|verify NAME`` accepts;
* ``add_arguments(parser)``: its options of ``capo data prepare NAME`` beyond the common ``--data-dir``,
  ``--force``, ``--mirror`` and ``--quiet``, each stored under the name of a keyword of ``prepare``;
* ``prepare(name, *, data_dir=None, force=False, base_url=None, progress=True, **options) -> Path``: build
  the dataset's folder all or nothing (manifest last) and return it;
* ``data_info(name, data_dir=None) -> list[dict]``: one entry per folder it prepares, with ``name``,
  ``path``, ``prepared``, ``prepare`` (the command that prepares it), ``counts``, and ``size`` where the
  domain has sizes (then the module also has ``SIZES``, which ``capo data verify --size`` picks from).

Every manifest records the sha256 of the files it vouches for, so :func:`verify` is the same for all.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from capo_envs.core.paths import MANIFEST, DataNotPreparedError

from .manifest import read_manifest, verify_files

MODULES = ("data_prep.qa", "data_prep.alfworld", "data_prep.webshop", "data_prep.papers")


@lru_cache(maxsize=None)
def domains() -> dict[str, ModuleType]:
    """Each dataset name -> the module that prepares it, in the order ``capo data list`` shows them."""
    table: dict[str, ModuleType] = {}
    for path in MODULES:
        module = importlib.import_module(path)
        for name in module.DATASETS:
            table[name] = module
    return table


def domain(name: str) -> ModuleType:
    table = domains()
    if name not in table:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(table)}")
    return table[name]


def prepare(name: str, **options) -> Path:
    """``capo data prepare NAME`` in code: the domain's ``prepare`` (its keywords: the module's docs)."""
    return domain(name).prepare(name, **options)


def data_info(name: str, data_dir: str | Path | None = None) -> list[dict]:
    return domain(name).data_info(name, data_dir)


def is_prepared(name: str, data_dir: str | Path | None = None) -> bool:
    """Whether ``name`` is prepared: one of its folders has its manifest (webshop: either size)."""
    return any(info["prepared"] for info in data_info(name, data_dir))


def check_folder(info: dict) -> list[str] | None:
    """Re-hash the files a prepared folder's manifest records: one line per missing or changed file; None
    when the manifest records no checksum (nothing was checked)."""
    manifest = read_manifest(Path(info["path"]))
    if not (manifest or {}).get("files"):
        return None
    return verify_files(Path(info["path"]), manifest)


def not_prepared_message(name: str, infos: list[dict]) -> str:
    missing = " or ".join(str(Path(info["path"]) / MANIFEST) for info in infos)
    return f"{name} is not prepared (no {missing}). Run: " + " or ".join(info["prepare"] for info in infos)


def verify(name: str, data_dir: str | Path | None = None) -> list[str]:
    """The problems ``capo data verify NAME`` finds in every prepared folder of ``name`` (empty when all
    files match); raises ``DataNotPreparedError`` when none is prepared."""
    infos = data_info(name, data_dir)
    prepared = [info for info in infos if info["prepared"]]
    if not prepared:
        raise DataNotPreparedError(not_prepared_message(name, infos))
    problems = []
    for info in prepared:
        found = check_folder(info)
        lines = [f"no file checksums in {Path(info['path']) / MANIFEST}"] if found is None else found
        problems += [f"{info['name']}: {line}" if len(prepared) > 1 else line for line in lines]
    return problems
