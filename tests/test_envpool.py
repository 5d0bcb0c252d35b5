"""capo_train.envpool: serial, thread and process env pools give byte-identical rollouts; the process pool's
env proxies behave like the envs they stand for; the config keys that choose a pool.

The rollouts use a tiny random Llama and a byte-level tokenizer built in memory (no download); the
SynthHouse case runs the real ALFWorld engine and is skipped without the ``alfworld`` extra.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import gymnasium as gym
import pytest

import capo_envs  # noqa: F401  (registers capo/*)
from capo_train.envpool import EnvPool, EnvWorkerError, ProcessEnv, auto_workers, pool_from_config, pool_map

KINDS = ("serial", "thread", "process")


def rollout_bytes(env_id: str, kwargs: dict, kind: str, *, tasks: int, group: int, seed: int = 3,
                  max_action_tokens: int = 12) -> tuple[bytes, list]:
    """JSON bytes of ``collect``'s trajectories with ``kind``'s pool (a fresh tiny model each time)."""
    import torch

    from capo_train.backends import HFBackend
    from capo_train.models import make_tiny_llama
    from capo_train.rollout import RolloutSettings, collect

    torch.manual_seed(0)
    model, tokenizer = make_tiny_llama(hidden_size=16, num_layers=1, seed=0)
    settings = RolloutSettings(max_action_tokens=max_action_tokens, max_prompt_tokens=4096)
    with EnvPool(kind, workers=2) as pool:
        envs = [pool.make(env_id, **kwargs) for _ in range(tasks * group)]
        try:
            trajectories = collect(envs, HFBackend(model.eval(), tokenizer, batch_size=len(envs)), tokenizer,
                                   settings, tasks_per_batch=tasks, group_size=group, seed=seed,
                                   env_pool=None if kind == "serial" else pool)
        finally:
            for env in envs:
                env.close()
    data = [dataclasses.asdict(t) for t in trajectories]
    return json.dumps(data, sort_keys=True).encode(), trajectories


def test_pools_give_identical_trajectories_on_synthchain():
    kwargs = {"k": 4, "expert_skill": 0.0}
    serial, trajectories = rollout_bytes("capo/SynthChain-v0", kwargs, "serial", tasks=2, group=2)
    assert len(trajectories) == 4 and all(t.actions for t in trajectories)
    for kind in ("thread", "process"):
        assert rollout_bytes("capo/SynthChain-v0", kwargs, kind, tasks=2, group=2)[0] == serial, kind


def test_waves_and_an_env_without_task_ids_give_identical_trajectories(monkeypatch):
    """More episodes than envs (two waves) on a plain env whose tasks are reset seeds (tests/plain_env_pkg;
    spawned workers inherit sys.path, so they import it too)."""
    import capo_train.rollout as rollout

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))

    def run(kind: str) -> bytes:
        import torch

        from capo_train.backends import HFBackend
        from capo_train.models import make_tiny_llama

        torch.manual_seed(0)
        model, tokenizer = make_tiny_llama(hidden_size=16, num_layers=1, seed=0)
        with EnvPool(kind, workers=2) as pool:
            envs = [pool.make("plain_env_pkg.envs:plain/Count-v0", max_steps=3) for _ in range(2)]
            out = rollout.collect(envs, HFBackend(model.eval(), tokenizer, batch_size=2), tokenizer,
                                  rollout.RolloutSettings(max_action_tokens=8, max_prompt_tokens=4096),
                                  tasks_per_batch=2, group_size=2, seed=1, env_pool=pool)
            for env in envs:
                env.close()
        return json.dumps([dataclasses.asdict(t) for t in out]).encode()

    serial = run("serial")
    assert run("thread") == serial and run("process") == serial


@pytest.mark.slow
def test_pools_give_identical_trajectories_on_synthhouse():
    from capo_envs.alfworld.engine import engine_available

    if not engine_available():
        pytest.skip("the alfworld extra is not installed")
    kwargs = {"size": "tiny", "max_steps": 3}
    serial, trajectories = rollout_bytes("capo/SynthHouse-v0", kwargs, "serial", tasks=2, group=1)
    assert [len(t.actions) for t in trajectories] == [3, 3]
    for kind in ("thread", "process"):
        assert rollout_bytes("capo/SynthHouse-v0", kwargs, kind, tasks=2, group=1)[0] == serial, kind


def test_process_env_stands_for_the_env():
    local = gym.make("capo/SynthChain-v0", k=3)
    with EnvPool("process", workers=1) as pool:
        remote = pool.make("capo/SynthChain-v0", k=3)
        assert isinstance(remote, ProcessEnv) and remote.unwrapped is remote
        assert list(remote.unwrapped.task_ids()) == list(local.unwrapped.task_ids())
        assert remote.spec.id == "capo/SynthChain-v0"
        assert remote.protocol.stop_strings == local.unwrapped.protocol.stop_strings
        task = local.unwrapped.task_ids()[0]
        assert remote.reset(seed=0, options={"task_id": task}) == local.reset(seed=0, options={"task_id": task})
        assert remote.expert_action() == local.unwrapped.expert_action()
        for action in ("<go>left</go>", "nonsense", "<go>right</go>"):  # k=3: the third ends the episode
            assert remote.step(action) == local.step(action)
        assert getattr(remote, "no_such_attribute", None) is None
        remote.close()
        remote.close()  # twice is fine


def test_worker_errors_reach_the_caller():
    with EnvPool("process", workers=1) as pool:
        with pytest.raises(Exception, match="k"):
            pool.make("capo/SynthChain-v0", k="many")  # the env's own ValueError, from the worker
        with pytest.raises(Exception):
            pool.make("capo/NoSuchEnv-v0")
        env = pool.make("capo/SynthChain-v0", k=2)
        with pytest.raises(Exception):
            env.step("<go>left</go>")  # before reset: the env refuses, the worker stays up
        env.reset(seed=0)
        assert isinstance(env.step("<go>left</go>")[0], str)
    with pytest.raises(EnvWorkerError, match="exited|died"):
        env.step("<go>left</go>")  # the pool is closed: its worker has gone


def test_map_keeps_order_and_raises_after_every_call():
    done = []

    def work(i: int) -> int:
        if i == 2:
            raise KeyError(i)
        done.append(i)
        return i * i

    for kind in KINDS:
        with EnvPool(kind, workers=3) as pool:
            assert pool.map(lambda i: i * i, range(10)) == [i * i for i in range(10)]
            done.clear()
            with pytest.raises(KeyError):
                pool.map(work, range(6))
            # serial stops at the failing call, as a loop does; concurrent pools let the others finish
            assert sorted(done) == ([0, 1] if kind == "serial" else [0, 1, 3, 4, 5])
    assert pool_map(None, str, [1, 2]) == ["1", "2"]


@pytest.mark.parametrize("kind, workers", [("fork", 2), ("thread", 0), ("thread", True), ("process", 1.5)])
def test_bad_pool_settings_are_refused(kind, workers):
    with pytest.raises(ValueError):
        EnvPool(kind, workers)


def test_config_keys_choose_the_pool():
    from capo_train.config import ConfigError, load_config

    config = load_config()  # the default: threads, as many as this process has CPUs
    assert (config.rollout.env_pool, config.rollout.env_workers) == ("thread", None)
    with pool_from_config(config.rollout) as pool:
        assert (pool.kind, pool.workers) == ("thread", auto_workers())
    assert pool_from_config(load_config(overrides=["rollout.env_pool=serial"]).rollout) is None  # still there
    config = load_config(overrides=["rollout.env_pool=thread", "rollout.env_workers=3"])
    pool = pool_from_config(config.rollout)
    assert (pool.kind, pool.workers) == ("thread", 3)
    pool.close()
    with pytest.raises(ConfigError, match="rollout.env_pool"):
        load_config(overrides=["rollout.env_pool=ray"])
    with pytest.raises(ConfigError, match="rollout.env_workers"):
        load_config(overrides=["rollout.env_workers=0"])


def test_auto_workers_share_the_cpus_among_a_nodes_processes(monkeypatch):
    import os

    cpus = len(os.sched_getaffinity(0))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert auto_workers() == cpus
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cpus + 1))  # more processes than CPUs: still one each
    assert auto_workers() == 1


def test_pools_start_no_more_workers_than_they_have_envs():
    import threading

    with EnvPool("process", workers=3) as pool:
        envs = [pool.make("capo/SynthChain-v0", k=2) for _ in range(2)]
        assert len(pool._workers) == 2  # the third process is never spawned
        assert [e.reset(seed=0)[0] for e in envs] == [gym.make("capo/SynthChain-v0", k=2).reset(seed=0)[0]] * 2
        more = [pool.make("capo/SynthChain-v0", k=2) for _ in range(3)]
        assert len(pool._workers) == 3 and more[2]._worker is pool._workers[1]  # then round-robin
    with EnvPool("thread", workers=8) as pool:
        names = pool.map(lambda _: threading.current_thread().name, range(3))
        assert len(pool._executor._threads) <= 3 and all(n.startswith("capo-env") for n in names)


def test_training_with_a_process_pool_matches_a_serial_run(tiny_model_dir, tmp_path):
    """``capo train`` end to end (warm start, 2 iterations, held-out evaluation): the same log and weights
    whichever pool played the episodes (serial, the default thread pool, a process pool)."""
    import torch

    from capo_train.config import load_config
    from capo_train.models.checkpoints import CHECKPOINT, load_checkpoint
    from capo_train.trainer import train

    small = ["iterations=2", "env.id=capo/SynthHop-v0", "env.kwargs={size: tiny, k: 1, max_passage_chars: 40}",
             "rollout.tasks_per_batch=2", "rollout.group_size=2", "rollout.max_action_tokens=8",
             "rollout.max_prompt_tokens=2000", "optim.minibatch_rows=2", "eval_every=2", "eval_episodes=2",
             "sft.episodes=2", "log_tensorboard=false", "record_every=0", f"model.path={tiny_model_dir}"]
    runs = {}
    for kind in ("serial", "default", "process"):  # the default is thread
        out = tmp_path / kind
        pool = [] if kind == "default" else [f"rollout.env_pool={kind}"]
        train(load_config(None, [*small, f"out_dir={out}", *pool]), progress=False)
        log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        timeless = [{k: v for k, v in r.items() if not k.startswith(("time/", "throughput/"))} for r in log]
        runs[kind] = timeless, load_checkpoint(out / CHECKPOINT)[0].state_dict()
    for kind in ("default", "process"):
        assert runs[kind][0] == runs["serial"][0], kind
        for key, value in runs["serial"][1].items():
            torch.testing.assert_close(runs[kind][1][key], value, rtol=0, atol=0, msg=f"{kind}: {key}")
