"""``capo/SynthHouse-v0``: ALFWorld games generated offline (``world.py``), played by the real engine.

Same contract as ``capo/ALFWorld-v0`` (see ``env.py``); the games are drawn from a seed instead of read from
disk. Task ids ``synthhouse-<size>-<seed>-<split>-<n>-<task_type>`` hold everything that makes the game: the
task type is ``task_types[n % len(task_types)]``, so every slice of consecutive ids mixes the types evenly,
and the room is drawn from ``random.Random(id)``. The splits' ids are disjoint (train 10,000, dev 500,
test 500 by default). Each game is generated in the engine process and kept only if ALFWorld's handcoded
expert wins it within 40 steps (``alfworld-generate``'s solvability check; a lost draw is replaced by the
next), so ``expert_action()`` wins every task within the default budget of 50 steps.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..core.env import choice_knob, int_knob
from .env import HouseEnv
from .games import resolve_task_types

# world.SIZES's names (receptacles per room: 3, 5, 8, 14, 22), repeated because world imports alfworld, which
# this module must not; tests/test_alfworld_synthhouse.py checks that the two agree.
SIZES = ("micro", "tiny", "small", "medium", "large")
SPLITS = ("train", "dev", "test")
DEFAULT_TASKS = {"train": 10_000, "dev": 500, "test": 500}


class SynthHouseEnv(HouseEnv):
    """Generated ALFWorld households: ``size`` micro|tiny|small|medium|large, ``split`` train|dev|test, ``seed``,
    ``task_types`` (ids 1-6 or names; default all six), ``num_tasks``; the rest as ``capo/ALFWorld-v0``."""

    def __init__(
        self,
        size: str = "small",
        split: str = "train",
        seed: int = 0,
        task_types: Sequence[int | str] | None = None,
        num_tasks: int | None = None,
        **kwargs: Any,
    ):
        choice_knob("size", size, SIZES)
        choice_knob("split", split, SPLITS)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        num_tasks = DEFAULT_TASKS[split] if num_tasks is None else int_knob("num_tasks", num_tasks, 1, 10**7)
        self.size, self.split, self.seed = size, split, seed
        self.task_types = resolve_task_types(task_types)
        types = self.task_types
        self._ids = tuple(f"synthhouse-{size}-{seed}-{split}-{n}-{types[n % len(types)]}" for n in range(num_tasks))
        super().__init__(**kwargs)

    def task_ids(self) -> Sequence[str]:
        return self._ids

    def task_type(self, task_id: str) -> str:
        return task_id.rsplit("-", 1)[1]

    def _load_request(self, task_id: str) -> dict[str, Any]:
        return {"op": "load_synth", "task_id": task_id, "task_type": self.task_type(task_id), "size": self.size}
