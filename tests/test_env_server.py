"""``capo serve env``: any env in OpenEnv's protocol, played by OpenEnv's own client (PyPI ``openenv``) unchanged, sessions
isolated, bounded (busy, idle timeout), bad input answered without taking the server down, and a load test of
256 concurrent sessions."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import gymnasium as gym
import pytest

import capo_envs  # noqa: F401
from capo_envs.remote import ws
from capo_envs.remote.client import AsyncSession, RemoteEnvError, SyncSession
from capo_envs.remote.server import EnvServer

TINY = {"size": "tiny"}
TESTS = Path(__file__).parent


@pytest.fixture
def server():
    with EnvServer("capo/SynthHop-v0", TINY, max_sessions=8).start_in_thread() as srv:
        yield srv


def http(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def local_episode(seed: int, actions_from_expert: int = 3):
    env = gym.make("capo/SynthHop-v0", **TINY)
    obs, info = env.reset(seed=seed)
    out = [(obs, None, False, False, info)]
    for _ in range(actions_from_expert):
        obs, reward, terminated, truncated, info = env.step(env.unwrapped.expert_action())
        out.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    env.close()
    return out


# --- OpenEnv's own client, unmodified ----------------------------------------------------------------------
def test_openenv_generic_client_plays_an_episode(server):
    openenv = pytest.importorskip("openenv.core.generic_client")
    task_id = gym.make("capo/SynthHop-v0", **TINY).unwrapped.task_ids()[5]
    with openenv.GenericEnvClient(base_url=server.url).sync() as env:
        result = env.reset(seed=3, task_id=task_id)
        assert result.done is False and result.reward is None
        assert result.observation["text"].startswith("Question:")
        assert result.observation["info"]["task_id"] == task_id
        assert result.observation["info"]["protocol"]["stop_strings"] == ["</search>", "</answer>"]
        result = env.step({"text": "I will look. <search>anything</search>"})
        info = result.observation["info"]
        assert result.done is False and result.reward == 0.0 and info["action_valid"] is True
        assert info["terminated"] is False and info["truncated"] is False
        result = env.step({"text": "<answer>no idea</answer>"})
        info = result.observation["info"]
        assert result.done is True and info["terminated"] is True and info["truncated"] is False
        assert info["ended_by"] == "terminated" and info["metrics"]["answered"] == 1.0
        state = env.state()
        assert state["step_count"] == 2 and state["task_id"] == task_id and state["done"] is True
        with pytest.raises(RuntimeError, match="EXECUTION_ERROR"):  # a finished episode: the protocol's error
            env.step({"text": "<search>more</search>"})
        result = env.reset(seed=3)  # and the session goes on
        assert result.observation["info"]["step"] == 0


def test_openenv_client_sees_truncation_and_the_same_episode_as_a_local_env(server):
    openenv = pytest.importorskip("openenv.core.generic_client")
    local = local_episode(seed=11)

    async def remote():
        async with openenv.GenericEnvClient(base_url=server.url) as env:  # the async client too
            first = await env.reset(seed=11)
            steps = [first]
            expert_env = gym.make("capo/SynthHop-v0", **TINY)  # replays the expert's actions
            expert_env.reset(seed=11)
            for obs, reward, *_ in local[1:]:
                action = expert_env.unwrapped.expert_action()
                expert_env.step(action)
                steps.append(await env.step({"text": action}))
            return steps

    steps = asyncio.run(remote())
    for (obs, reward, terminated, truncated, info), result in zip(local, steps):
        got = dict(result.observation["info"])
        assert (got.pop("terminated"), got.pop("truncated")) == (terminated, truncated)
        assert result.observation["text"] == obs and result.reward == reward and got == json.loads(json.dumps(info))

    with EnvServer("capo/SynthHop-v0", {**TINY, "max_steps": 1}).start_in_thread() as short:
        with openenv.GenericEnvClient(base_url=short.url).sync() as env:
            env.reset(seed=0)
            result = env.step({"text": "<search>q</search>"})
            info = result.observation["info"]
            assert result.done and info["truncated"] and not info["terminated"] and info["ended_by"] == "step_budget"


def test_sessions_are_isolated(server):
    expected = {seed: local_episode(seed) for seed in (1, 2)}
    a, b = SyncSession(server.url), SyncSession(server.url)
    replay = {seed: gym.make("capo/SynthHop-v0", **TINY) for seed in (1, 2)}
    try:
        for seed, session in ((1, a), (2, b)):
            assert session.reset(seed=seed)["observation"]["text"] == expected[seed][0][0]
            replay[seed].reset(seed=seed)
        for i in range(1, 3):  # interleaved steps: neither sees the other's episode
            for seed, session in ((1, a), (2, b)):
                answer = session.step(replay[seed].unwrapped.expert_action())
                replay[seed].step(replay[seed].unwrapped.expert_action())
                assert answer["observation"]["text"] == expected[seed][i][0]
        assert server.status()["active_sessions"] == 2
    finally:
        a.close()
        b.close()


# --- bounded: busy, idle, shutdown ------------------------------------------------------------------------
def test_a_full_server_answers_busy_then_serves_again():
    with EnvServer("capo/SynthChain-v0", max_sessions=2).start_in_thread() as srv:
        held = [SyncSession(srv.url).connect() for _ in range(2)]
        for session in held:
            session.reset(seed=0)
        with pytest.raises(RemoteEnvError) as refused:
            SyncSession(srv.url).reset(seed=0)
        assert refused.value.code == "CAPACITY_REACHED" and "busy" in str(refused.value)
        assert http(srv.url + "/reset", "POST", b"{}")[0] == 503
        openenv = pytest.importorskip("openenv.core.generic_client")
        with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
            with openenv.GenericEnvClient(base_url=srv.url).sync() as env:
                env.reset()
        held.pop().close()
        deadline = time.monotonic() + 5
        while srv.status()["active_sessions"] > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        with SyncSession(srv.url) as again:
            assert again.reset(seed=0)["observation"]["text"].startswith("Step 1/")
        held[0].close()


def test_idle_sessions_are_closed_and_their_slot_freed():
    with EnvServer("capo/SynthChain-v0", max_sessions=1, idle_timeout=0.3).start_in_thread() as srv:
        session = SyncSession(srv.url)
        session.reset(seed=0)
        time.sleep(0.8)
        assert srv.status()["active_sessions"] == 0
        with pytest.raises(ConnectionError, match="idle"):
            session.step("<go>left</go>")
        assert session.reset(seed=0)["observation"]["info"]["step"] == 0  # a new session


def test_shutdown_ends_open_sessions_and_closes_their_envs():
    srv = EnvServer("capo/SynthChain-v0", max_sessions=4).start_in_thread()
    sessions = [SyncSession(srv.url) for _ in range(3)]
    for s in sessions:
        s.reset(seed=0)
    srv.shutdown()
    assert srv.status()["active_sessions"] == 0 and not srv._pool


# --- bad input: a clear error, and the server stays up ------------------------------------------------------
def raw_session(url: str) -> ws.Connection:
    return ws.connect(url)


@pytest.mark.parametrize("message, code, match", [
    ("{not json", "INVALID_JSON", "Invalid JSON"),
    ('"a string"', "VALIDATION_ERROR", "JSON object"),
    ('{"type": "jump"}', "UNKNOWN_TYPE", "jump"),
    ('{"type": "step", "data": {"text": "<search>q</search>"}}', "EXECUTION_ERROR", "before reset"),
    ('{"type": "reset", "data": {"sed": 1}}', "VALIDATION_ERROR", "unknown reset field 'sed'"),
    ('{"type": "reset", "data": {"seed": -1}}', "VALIDATION_ERROR", "seed"),
    ('{"type": "reset", "data": {"seed": "x"}}', "VALIDATION_ERROR", "seed"),
    ('{"type": "reset", "data": {"task_id": "nope"}}', "EXECUTION_ERROR", "unknown task_id"),
    ('{"type": "reset", "data": []}', "VALIDATION_ERROR", "JSON object"),
    ('{"type": "step", "data": "text"}', "VALIDATION_ERROR", "text"),
    ('{"type": "step", "data": {"txt": "a"}}', "VALIDATION_ERROR", "text"),
    ('{"type": "call", "data": {"name": "__init__"}}', "VALIDATION_ERROR", "call needs a name"),
    ('[' * 100_000 + ']' * 100_000, "INVALID_JSON", "Invalid JSON"),
])
def test_bad_messages_get_a_clear_error_and_the_session_goes_on(server, message, code, match):
    conn = raw_session(server.url)
    try:
        conn.send_text(message)
        answer = json.loads(conn.recv_text(10))
        assert answer["type"] == "error" and answer["data"]["code"] == code
        assert match in answer["data"]["message"]
        conn.send_text('{"type": "reset", "data": {"seed": 0}}')
        assert json.loads(conn.recv_text(10))["type"] == "observation"
    finally:
        conn.close()


def test_protocol_violations_close_only_that_connection(server):
    for frame in (ws.encode_frame(ws.OP_BINARY, b"{}", mask=True),  # binary: refused
                  ws.encode_frame(ws.OP_TEXT, b"{}", mask=False),  # unmasked client frame
                  bytes([0x81, 0xFF]) + (1 << 40).to_bytes(8, "big"),  # a 1 TB message
                  ws.encode_frame(ws.OP_TEXT, b"\xff\xfe", mask=True)):  # not UTF-8
        conn = raw_session(server.url)
        conn.sock.sendall(frame)
        with pytest.raises(ws.WebSocketClosed):
            conn.recv_text(10)
    conn = raw_session(server.url)  # random bytes after the upgrade
    conn.sock.sendall(os.urandom(64))
    with pytest.raises((ws.WebSocketClosed, TimeoutError)):
        conn.recv_text(10)
    conn.close()
    assert http(server.url + "/health") == (200, {"status": "healthy"})


def test_http_routes(server):
    assert http(server.url + "/health") == (200, {"status": "healthy"})
    status, meta = http(server.url + "/metadata")
    assert status == 200 and meta["env_id"] == "capo/SynthHop-v0" and meta["kwargs"] == TINY
    assert meta["protocol"]["name"] == "tags" and set(meta["calls"]) == {"task_ids", "expert_action", "available_actions", "parse"}
    status, schema = http(server.url + "/schema")
    assert status == 200 and schema["action"]["required"] == ["text"] and {"action", "observation", "state"} <= set(schema)
    status, first = http(server.url + "/reset", "POST", b'{"seed": 4}')
    assert status == 200 and first["observation"]["text"] == local_episode(4)[0][0] and first["done"] is False
    status, answer = http(server.url + "/step", "POST", b'{"action": {"text": "x"}}')
    assert status == 400 and "/ws" in answer["error"] and answer["detail"] == answer["error"]
    assert http(server.url + "/reset", "POST", b'{"seed": "x"}')[0] == 400
    assert http(server.url + "/reset", "POST", b"[1]")[0] == 400
    assert http(server.url + "/nope")[0] == 404
    assert http(server.url + "/ws")[0] == 400  # not an upgrade
    assert http(server.url + "/state")[1]["max_sessions"] == 8


def test_a_module_id_env_is_served(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    with EnvServer("plain_env_pkg.envs:plain/Count-v0").start_in_thread() as srv:
        with SyncSession(srv.url) as session:
            first = session.reset(seed=0)
            target = first["observation"]["text"].split()[1].rstrip(".")
            done = session.step(target)
            assert done["done"] and done["reward"] == 1.0 and done["observation"]["info"]["terminated"]
            with pytest.raises(RemoteEnvError, match="no task_ids"):
                session.call("task_ids")
        assert http(srv.url + "/metadata")[1]["calls"] == []


def test_a_bad_env_id_or_kwargs_fails_before_serving():
    with pytest.raises(gym.error.Error):
        EnvServer("capo/NoSuchEnv-v0")
    with pytest.raises(TypeError):
        EnvServer("capo/SynthChain-v0", {"nope": 1})


def test_capo_serve_env_cli(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "capo_train.cli", "serve", "env", "capo/SynthHop-v0", "--kwargs",
                             json.dumps(TINY), "--port", str(port), "--max-sessions", "4", "--idle-timeout", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = proc.stdout.readline()
        assert f"127.0.0.1:{port}" in banner and "OpenEnv" in banner
        with SyncSession(f"http://127.0.0.1:{port}") as session:
            assert session.reset(seed=4)["observation"]["text"] == local_episode(4)[0][0]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    bad = subprocess.run([sys.executable, "-m", "capo_train.cli", "serve", "env", "capo/SynthHop-v0", "--kwargs", "[1]"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--kwargs must be a JSON object" in bad.stderr


# --- load: 256 concurrent sessions --------------------------------------------------------------------------
SESSIONS, STEPS = 256, 6


@pytest.mark.slow
def test_256_concurrent_sessions_step_without_errors():
    """Every session plays its own seed's expert episode (bounded to STEPS actions) at the same time as the
    others; each answer must be what a local env gives. Timings are the benchmark's job
    (benchmarks/bench_env_server.py)."""
    with EnvServer("capo/SynthHop-v0", TINY, max_sessions=SESSIONS).start_in_thread() as srv:
        replay = gym.make("capo/SynthHop-v0", **TINY)
        plans = {}
        for seed in range(SESSIONS):  # the expert's actions and the local env's observations, per seed
            obs, _ = replay.reset(seed=seed)
            steps = []
            for _ in range(STEPS):
                action = replay.unwrapped.expert_action()
                next_obs, reward, terminated, truncated, _ = replay.step(action)
                steps.append((action, next_obs, reward, terminated or truncated))
                if terminated or truncated:
                    break
            plans[seed] = (obs, steps)
        errors: list[str] = []

        async def play(seed: int) -> int:
            first, steps = plans[seed]
            try:
                async with AsyncSession(srv.url) as env:
                    got = await env.reset(seed=seed)
                    assert got["observation"]["text"] == first
                    for action, obs, reward, done in steps:
                        got = await env.step(action)
                        assert (got["observation"]["text"], got["reward"], got["done"]) == (obs, reward, done)
                    return len(steps)
            except Exception as e:  # noqa: BLE001 - counted, reported below
                errors.append(f"{seed}: {type(e).__name__}: {e}")
                return 0

        async def main():
            return await asyncio.gather(*(play(seed) for seed in range(SESSIONS)))

        stepped = asyncio.run(main())
        assert not errors, errors[:5]
        assert sum(stepped) > SESSIONS and srv.status()["sessions_served"] >= SESSIONS


def test_fresh_envs_are_never_reused_and_reused_ones_need_a_reset():
    with EnvServer("capo/SynthChain-v0", reuse_envs=False).start_in_thread() as srv:
        with SyncSession(srv.url) as session:
            session.reset(seed=0)
        time.sleep(0.2)
        assert not any(srv._pool.values())
    with EnvServer("capo/SynthChain-v0").start_in_thread() as srv:
        with SyncSession(srv.url) as session:
            session.reset(seed=0)
            session.step("<go>left</go>")
        time.sleep(0.2)
        with SyncSession(srv.url) as session:  # the same env, but not the same episode
            with pytest.raises(RemoteEnvError, match="before reset"):
                session.step("<go>left</go>")
            assert session.reset(seed=0)["observation"]["info"]["step"] == 0
