"""Any Gymnasium text env trains: ``plain_env_pkg`` is written as an outside author would (no capo import,
no ``task_ids()``, no ``split``, no expert), and is reached only through Gymnasium's ``module:Id`` form."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from capo_train.cli import main
from capo_train.rollout import HELD_OUT_SEED, ChatFormat, env_tasks, rollout_stats, start_episode, step_episode
from capo_train.trainer import takes_split

TESTS = Path(__file__).parent
ENV = "plain_env_pkg.envs:plain/Count-v0"
BARE = "plain_env_pkg.envs:plain/CountBare-v0"  # no info["protocol"], no info["metrics"]


def capo(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``capo ...`` in a fresh process that can import plain_env_pkg, as an env author's shell would."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "capo_train.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_a_plain_env_trains_through_the_cli_and_is_evaluated_before_rl(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    done = capo("train", "--env", ENV, "--model", str(tiny_model_dir), "--out", str(out),
                "iterations=1", "model.lora=false", "rollout.episodes_per_batch=2", "rollout.max_action_tokens=4",
                "eval_episodes=2", "eval_every=1", "optim.minibatch_rows=2", "log_tensorboard=false", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no expert_action(): no warm start" in done.stderr  # sft.episodes=48 by default: skipped, said so
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1]
    before_rl = records[0]
    assert before_rl["eval/episodes"] == 2.0 and 0.0 <= before_rl["eval/success"] <= 1.0
    assert not any(k.startswith("sft/") for k in before_rl)  # no warm start, but a held-out figure
    assert records[1]["rollout/episodes"] == 2.0 and "eval/success" in records[1]
    saved = json.loads((out / "checkpoint" / "config.json").read_text())
    assert saved["optim"]["actor_lr"] == 1e-3  # auto: a full fine-tune of a model under 10M parameters
    assert saved["env"]["id"] == ENV


@pytest.mark.parametrize("args, message", [
    (["--env", "plain_env_pkg.envs:plain/Cont-v0"],
     f"unknown env 'plain_env_pkg.envs:plain/Cont-v0'; did you mean {ENV!r}"),
    (["--env", "no_such_pkg:plain/Count-v0"],
     "env 'no_such_pkg:plain/Count-v0': importing 'no_such_pkg' failed: ModuleNotFoundError"),
    (["--env", ENV, "env.kwargs={colour: red}"], r"cannot make env .* \{'colour': 'red'\}: TypeError: .*colour"),
    (["--env", ENV, "env.kwargs={split: test}"], "env.kwargs must not set split"),
])
def test_a_bad_env_fails_before_the_model_loads(args, message, tmp_path):
    # The model path does not exist: reaching the model would give another message.
    with pytest.raises(SystemExit, match=f"^capo: {message}"):
        main(["train", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "run"), *args])
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_bad_env_kwargs_exit_with_a_message_not_a_traceback(tmp_path):
    done = capo("train", "--env", ENV, "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "run"),
                "env.kwargs={max_step: 3}", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("capo: cannot make env 'plain_env_pkg.envs:plain/Count-v0'")
    assert "Traceback" not in done.stderr and "max_step" in done.stderr


def test_tasks_of_an_env_without_task_ids_are_seeds_held_out_ones_disjoint():
    env = gym.make(ENV)
    train, held_out = env_tasks(env), env_tasks(env, held_out=True)
    assert train[0] == 0 and held_out[0] == HELD_OUT_SEED and train[-1] < held_out[0]
    assert len(train) == len(held_out) == HELD_OUT_SEED
    assert not takes_split(ENV) and takes_split("capo/SynthHop-v0")
    synth = gym.make("capo/SynthHop-v0", size="tiny", split="train")
    assert env_tasks(synth) == list(synth.unwrapped.task_ids())


@pytest.mark.parametrize("env_id", [ENV, BARE])
def test_episodes_by_seed_and_success_with_or_without_protocol_and_metrics(env_id, tiny_model_dir):
    """Through the rollout's own start/step code: a task is its reset seed (two episodes of one task see
    the same question), and success is metrics["success"], or the last reward > 0 when there are none."""
    from capo_train.models import load_actor

    _, tokenizer = load_actor(tiny_model_dir)
    fmt = ChatFormat(tokenizer)
    env = gym.make(env_id)
    trajectories, questions = [], []
    for n, task in enumerate([3, 3, 7, 8]):
        episode = start_episode(env, fmt, task, seed=12345 + n, traj_id=n, group_id=task)
        questions.append(episode.obs)
        target = env.unwrapped.target
        answer = str(target) if n % 2 == 0 else "none"  # right, wrong, right, wrong
        going = True
        while going:
            ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
            going = step_episode(episode, episode.state.prompt(), ids, [0.0] * len(ids), answer, 10_000)
        trajectories.append(episode.traj)
    assert questions[0] == questions[1] and [t.task_id for t in trajectories] == ["3", "3", "7", "8"]
    assert questions[0] == gym.make(env_id).reset(seed=3)[0]  # task 3 = reset seed 3
    assert rollout_stats(trajectories)["success"] == 0.5
    assert [t.terminated for t in trajectories] == [True, False, True, False]
    if env_id == BARE:
        assert all(t.metrics == {} for t in trajectories)
        assert trajectories[0].actions[0].prompt_ids == fmt.first("", questions[0])  # no system prompt
        assert episode.stop == ()  # actions end at EOS or max_action_tokens
    else:
        assert episode.stop == ("</n>",)


@pytest.mark.parametrize("env_id", [ENV, BARE])
def test_capo_demo_on_an_env_without_an_expert_says_so(env_id, tmp_path):
    done = capo("demo", "--env", env_id, "--episodes", "1", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "this env has no expert" in done.stdout and "Traceback" not in done.stderr
    assert "tasks by reset seed" in done.stdout  # no task_ids(): tasks are reset seeds, as rollout.env_tasks
    published = "(none: the env publishes no protocol)" not in done.stdout
    assert published == (env_id == ENV)
