"""A panel's definition and its hash (``capo_envs.core.panels`` has the rest): apart, so that the panel list
(``panel_list.py``) and the code that checks panels can both import it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


@dataclass(frozen=True)
class Panel:
    name: str
    env_id: str
    split: str
    size: int  # the first ``size`` ids of the split's task_ids()
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # to gym.make, besides split
    packages: tuple[str, ...] = ()  # distributions whose versions change scores
    pinned: Mapping[str, str] | None = None  # expected components; None: not pinned yet
    about: str = ""

    @property
    def pinned_hash(self) -> str | None:
        return panel_hash(self.pinned) if self.pinned is not None else None


def digest(value: Any) -> str:
    """First 16 hex digits of SHA-256 over ``value`` as canonical JSON (sorted keys, no NaN guessing)."""
    data = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=_jsonable)
    return hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def panel_hash(components: Mapping[str, str]) -> str:
    return "sha256:" + digest({k: components[k] for k in sorted(components)})


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bytes):
        return hashlib.sha256(value).hexdigest()
    return repr(value)
