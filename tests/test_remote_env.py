"""``capo/Remote-v0``: a served env played as a local Gymnasium env passes the local env's contract checks
(check_env, every adversarial action of tests/test_bad_input.py, both vector env kinds), gives the local env's
episodes, and publishes its tasks, expert and protocol; the asyncio client steps many sessions at once."""

from __future__ import annotations

import asyncio
import json
import pickle
import time
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import capo_envs  # noqa: F401
from capo_envs.remote.client import AsyncSession
from capo_envs.remote.env import _LOOPBACK
from capo_envs.remote.server import EnvServer
import test_bad_input as bad_input  # its checks, run on remote envs (not collected again here)
from test_env_contract import make_vector

TINY = {"size": "tiny"}


@pytest.fixture(scope="module")
def hop_server():
    with EnvServer("capo/SynthHop-v0", TINY, max_sessions=64).start_in_thread() as srv:
        yield srv


@pytest.fixture(scope="module")
def tool_server():
    with EnvServer("capo/SynthHop-v0", {**TINY, "action_format": "tool_call"}).start_in_thread() as srv:
        yield srv


def test_check_env(hop_server):
    env = gym.make("capo/Remote-v0", url=hop_server.url, disable_env_checker=True)
    check_env(env.unwrapped, skip_render_check=False)
    env.close()


def test_check_env_on_the_loopback_default():
    env = gym.make("capo/Remote-v0", disable_env_checker=True)  # serves capo/SynthChain-v0 from this process
    check_env(env.unwrapped, skip_render_check=False)
    assert env.reset(seed=0)[0].startswith("Step 1/")
    env.close()
    assert not [key for key in _LOOPBACK if key[1] == "capo/SynthChain-v0"]  # the last user stopped it


@pytest.mark.parametrize("which", ["hop_server", "tool_server"])
def test_every_nasty_action_is_an_invalid_step_or_parsed(which, request):
    bad_input.take_every_nasty_action(("capo/Remote-v0", {"url": request.getfixturevalue(which).url}))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_bad_inputs_never_crash_remote_vector_envs(hop_server, mode):
    bad_input.test_bad_inputs_never_crash_vector_envs(("capo/Remote-v0", {"url": hop_server.url}), mode)


def test_episodes_tasks_expert_and_protocol_are_the_local_envs(hop_server):
    local = gym.make("capo/SynthHop-v0", **TINY)
    remote = gym.make("capo/Remote-v0", url=hop_server.url, env_id="capo/SynthHop-v0", kwargs=TINY)
    base = remote.unwrapped
    assert list(base.task_ids()) == list(local.unwrapped.task_ids())
    assert base.protocol.describe() == local.unwrapped.protocol.describe()
    assert base.protocol.stop_strings == local.unwrapped.protocol.stop_strings
    for task_id in local.unwrapped.task_ids()[:5]:
        expected = local.reset(seed=1, options={"task_id": task_id})
        got = remote.reset(seed=1, options={"task_id": task_id})
        assert got == tuple(json.loads(json.dumps(expected)))
        done = False
        while not done:
            action = local.unwrapped.expert_action()
            assert base.expert_action() == action
            expected = local.step(action)
            got = remote.step(action)
            assert got == tuple(json.loads(json.dumps(expected)))
            done = got[2] or got[3]
        assert got[4]["metrics"]["em"] == 1.0
    with pytest.raises(RuntimeError, match="finished episode"):
        remote.step("<search>q</search>")
    with pytest.raises(ValueError, match="unknown task_id"):  # the served env's error, as its own type
        remote.reset(options={"task_id": "nope"})
    assert base.protocol.parse("<search>a b</search>").action.to_dict() == {"name": "search", "args": {"query": "a b"}}
    copy = pickle.loads(pickle.dumps(base.protocol))  # a process pool's copy asks through its own session
    assert copy.parse("<answer>x").error == local.unwrapped.protocol.parse("<answer>x").error
    remote.close()


def test_a_server_of_another_env_or_kwargs_is_refused(hop_server):
    with pytest.raises(ValueError, match="serves capo/SynthHop-v0, not capo/SynthChain-v0"):
        gym.make("capo/Remote-v0", url=hop_server.url, env_id="capo/SynthChain-v0")
    with pytest.raises(ValueError, match="kwargs"):
        gym.make("capo/Remote-v0", url=hop_server.url, kwargs={"size": "small"})
    with pytest.raises(ConnectionError, match="capo serve env"):
        gym.make("capo/Remote-v0", url="http://127.0.0.1:9")


def test_split_is_the_sessions_and_ignored_with_a_warning_without_one(hop_server, monkeypatch):
    dev = gym.make("capo/Remote-v0", url=hop_server.url, split="dev")
    assert list(dev.unwrapped.task_ids()) == list(gym.make("capo/SynthHop-v0", **TINY, split="dev").unwrapped.task_ids())
    dev.close()
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    with EnvServer("plain_env_pkg.envs:plain/Count-v0").start_in_thread() as srv:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env = gym.make("capo/Remote-v0", url=srv.url, split="train")
        assert any("has no split" in str(w.message) for w in caught)
        base = env.unwrapped  # what the served env lacks, the remote one lacks too (the trainer checks)
        assert getattr(base, "task_ids", None) is None and getattr(base, "expert_action", None) is None
        obs, info = env.reset(seed=0)
        assert info["protocol"]["stop_strings"] == ["</n>"]
        obs, reward, terminated, truncated, info = env.step(obs.split()[1].rstrip("."))
        assert (reward, terminated, truncated) == (1.0, True, False) and info["metrics"]["success"] == 1.0
        env.close()


def test_a_session_closed_by_the_server_is_reopened_on_reset():
    with EnvServer("capo/SynthChain-v0", idle_timeout=0.3).start_in_thread() as srv:
        env = gym.make("capo/Remote-v0", url=srv.url)
        first = env.reset(seed=5)
        time.sleep(0.8)
        with pytest.raises(ConnectionError, match="idle"):
            env.step("<go>left</go>")
        assert env.reset(seed=5) == first
        env.close()


def test_vector_envs_play_remote_sessions(hop_server):
    for mode in ("sync", "async"):
        envs = make_vector(mode, [lambda: gym.make("capo/Remote-v0", url=hop_server.url) for _ in range(3)])
        obs, infos = envs.reset(seed=[0, 1, 2])
        local = [gym.make("capo/SynthHop-v0", **TINY).reset(seed=s)[0] for s in range(3)]
        assert list(obs) == local
        obs, rewards, terminated, truncated, infos = envs.step(envs.call("expert_action"))
        assert infos["action_valid"].all()
        envs.close()


def test_the_asyncio_client_steps_64_sessions_at_once(hop_server):
    replay = gym.make("capo/SynthHop-v0", **TINY)
    expected = {}
    for seed in range(64):
        replay.reset(seed=seed)
        expected[seed] = replay.step(replay.unwrapped.expert_action())[0]

    async def play(seed):
        async with AsyncSession(hop_server.url) as env:
            await env.reset(seed=seed)
            action = await env.call("expert_action")
            return (await env.step(action))["observation"]["text"]

    async def main():
        return await asyncio.gather(*(play(seed) for seed in range(64)))

    assert asyncio.run(main()) == [expected[seed] for seed in range(64)]


@pytest.mark.slow
def test_capo_train_on_an_env_served_by_another_process(tiny_model_dir, tmp_path):
    """`capo train --env capo/Remote-v0 "env.kwargs={url: ...}"` against `capo serve env` in its own process:
    the warm start (the served expert), the rollouts and the held-out evaluation (split dev) all go through it."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "capo_train.cli", "serve", "env", "capo/SynthChain-v0", "--kwargs",
                               '{"k": 2}', "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert "serving" in server.stdout.readline()
        out = tmp_path / "run"
        done = subprocess.run(
            [sys.executable, "-m", "capo_train.cli", "train", "--env", "capo/Remote-v0", "--model", str(tiny_model_dir),
             "--out", str(out), f"env.kwargs={{url: 'http://127.0.0.1:{port}'}}", "iterations=1", "model.lora=false",
             "rollout.episodes_per_batch=2", "rollout.max_action_tokens=4", "sft.episodes=2", "eval_episodes=2",
             "eval_every=1", "optim.minibatch_rows=2", "log_tensorboard=false"],
            capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert done.returncode == 0, done.stderr[-3000:]
        records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        assert [r["iteration"] for r in records] == [0, 1]
        assert records[0]["eval/episodes"] == 2.0 and records[1]["rollout/episodes"] == 2.0
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
