"""Data-parallel training: two CPU processes under torchrun (gloo), each collecting its own episodes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

WORKER = textwrap.dedent(
    """
    import hashlib, sys
    import torch
    from capo_train.config import load_config
    from capo_train.trainer import train
    from capo_train import trainer

    model_dir, out_dir = sys.argv[1], sys.argv[2]
    config = load_config(None, [
        f"model.path={model_dir}", f"out_dir={out_dir}", "iterations=2", "device=cpu",
        "env.id=capo/SynthHop-v0", "env.kwargs={size: tiny, k: 1, max_passage_chars: 40}", "rollout.tasks_per_batch=2",
        "rollout.max_action_tokens=8", "rollout.max_prompt_tokens=2000", "optim.minibatch_rows=1",
        "eval_every=2", "eval_episodes=3", "sft.episodes=0", "log_tensorboard=false", "model.lora=false",
    ])
    seen = []
    collect = trainer.collect
    def recording_collect(*args, **kwargs):  # which tasks this process drew
        trajectories = collect(*args, **kwargs)
        seen.extend(t.task_id for t in trajectories)
        return trajectories
    trainer.collect = recording_collect
    built = {}
    build_model = trainer.build_model
    def keep(*args):
        built["model"] = build_model(*args)
        return built["model"]
    trainer.build_model = keep
    train(config, progress=False)
    model = built["model"][0]
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    rank = torch.distributed.get_rank()
    open(f"{out_dir}/rank-{rank}.txt", "w").write(digest + "\\n" + ",".join(seen))
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(600)
def test_two_processes_train_in_lockstep(tiny_model_dir, tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), str(tmp_path / "worker.py"), str(tiny_model_dir), str(out),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=540, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [(out / f"rank-{r}.txt").read_text().split("\n") for r in (0, 1)]
    assert ranks[0][0] == ranks[1][0]  # gradients averaged: the weights stay identical
    assert ranks[0][1] != ranks[1][1]  # but each process collected its own episodes
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1, 2]  # one log, written by the main process
    assert records[0]["eval/episodes"] == 3.0  # held-out before RL
    assert all(r["rollout/episodes"] == 4.0 for r in records[1:])  # statistics over both processes' episodes
    assert records[-1]["eval/episodes"] == 3.0  # the held-out tasks shared out, then gathered
    assert (out / "checkpoint").is_dir() and (out / "summary.json").is_file()
