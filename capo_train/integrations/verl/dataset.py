"""Parquet task rows for verl's ``RLHFDataset``: one row per task of a capo-contract env.

verl's dataset needs a chat ``prompt`` column; the ``capo_env`` agent loop ignores it (the episode's first
observation comes from ``env.reset``) and reads ``extra_info`` instead: ``env_id``, ``env_kwargs`` (JSON),
``task_id``, ``seed``, ``split``. ``agent_name`` picks the loop per row.

    python -m capo_train.integrations.verl.dataset --env capo/SynthChain-v0 --split train --out train.parquet
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from capo_train.rollout import env_tasks

from .core import AGENT_LOOP


def task_rows(env_id: str, *, split: str | None = None, env_kwargs: dict | None = None, count: int | None = None,
              seed: int = 0, held_out: bool = False) -> list[dict]:
    """One verl dataset row per task of ``env_id`` (the env's ``task_ids()``, else reset seeds as capo_train
    uses them: training seeds from 0, held-out ones from 1 000 000), the first ``count`` of them."""
    from .agent_loop import make_env  # noqa: PLC0415  (verl import: only when rows are built)

    kwargs = dict(env_kwargs or {})
    if split is not None:
        kwargs["split"] = split
    env = make_env(env_id, kwargs)
    try:
        tasks = list(env_tasks(env, held_out=held_out)[: count if count is not None else None])
    finally:
        env.close()
    return [
        {
            "data_source": env_id,
            "agent_name": AGENT_LOOP,
            "prompt": [{"role": "user", "content": f"{env_id} task {task}"}],
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"env_id": env_id, "env_kwargs": json.dumps(kwargs, sort_keys=True), "task_id": str(task),
                           "seed": seed + i, "split": split or "", "index": i},
        }
        for i, task in enumerate(tasks)
    ]


def write_parquet(rows: list[dict], path: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="a registered env id, or Gymnasium's module:Id")
    parser.add_argument("--split", default=None)
    parser.add_argument("--env-kwargs", default="{}", help="JSON object passed to gym.make")
    parser.add_argument("--count", type=int, default=None, help="first N tasks (default: all)")
    parser.add_argument("--held-out", action="store_true", help="seed-only envs: the held-out seeds")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rows = task_rows(args.env, split=args.split, env_kwargs=json.loads(args.env_kwargs), count=args.count,
                     held_out=args.held_out)
    print(f"{len(rows)} tasks -> {write_parquet(rows, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
