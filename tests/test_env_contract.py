"""The environment contract, checked on every offline env id."""

import random
import subprocess
import sys
import threading

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import capo_envs
from capo_envs.core import DataNotPreparedError
from capo_envs.qa.env import MultiHopQAEnv
from capo_envs.qa.task import QATask
from capo_envs.retrieval.base import Hit, Retriever

from env_helpers import expert_metrics

OFFLINE_ENVS = {"capo/SynthHop-v0": {"size": "tiny"}}
INFO_KEYS = {"task_id", "step", "action_valid", "action", "invalid_reason"}


def make(env_id, **kwargs):
    return gym.make(env_id, **{**OFFLINE_ENVS[env_id], **kwargs})


@pytest.fixture(params=sorted(OFFLINE_ENVS))
def env_id(request):
    return request.param


def adversarial_actions(rng: random.Random, n: int):
    fixed = [
        "", " ", "\n", "x" * 100_000, "<search>", "</search>", "<search><search>q</search></search>",
        "<answer>", "<answer></answer>", "<search>\x00\x01\x02</search>", "\x1b[2J\x07", "\ud800",
        "<search>" * 5000, "<answer>a</answer>" * 3, "<tool_call>{}</tool_call>", "<search>q</answer>",
        "<SEARCH>q</SEARCH>", "<search>q</search>trailing text", "<think><search>q</search></think>",
        None, 42, 3.5, b"<search>q</search>", ["<search>q</search>"], {"name": "search"},
    ]
    alphabet = "<>/searchanswer \n\t{}\":,\x00\u200béü中🚀"
    for i in range(n):
        if i < len(fixed):
            yield fixed[i]
            continue
        kind = rng.random()
        if kind < 0.4:
            yield "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        elif kind < 0.7:
            yield "".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(0, 30)))
        else:
            tag = rng.choice(["search", "answer"])
            body = "".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(0, 40)))
            yield f"{'reasoning ' * rng.randint(0, 3)}<{tag}>{body}</{tag}>"


def test_check_env(env_id):
    env = make(env_id, disable_env_checker=True)
    check_env(env.unwrapped, skip_render_check=False)
    env.close()


def test_thousand_adversarial_actions_never_crash(env_id):
    env = make(env_id)
    rng = random.Random(0)
    obs, info = env.reset(seed=0)
    invalid = 0
    for action in adversarial_actions(rng, 1200):
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and obs in env.observation_space
        assert isinstance(reward, float)
        assert INFO_KEYS <= set(info)
        assert info["action_valid"] == (info["invalid_reason"] == "") == (info["action"]["name"] != "")
        if not info["action_valid"]:
            invalid += 1
            assert obs.startswith("Invalid action:") and reward == 0.0
        assert not (terminated and truncated)
        if terminated or truncated:
            assert "metrics" in info
            obs, info = env.reset()
    assert invalid > 500
    env.close()


def test_registration_by_module_prefix_and_no_torch():
    code = (
        "import sys, gymnasium as gym\n"
        "env = gym.make('capo_envs:capo/SynthHop-v0', size='tiny')\n"
        "obs, info = env.reset(seed=1)\n"
        "assert 'torch' not in sys.modules and 'capo_train' not in sys.modules, 'capo_envs imported torch'\n"
        "print(type(env.unwrapped).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "SynthHopEnv"


def test_every_catalog_id_is_registered():
    for env_id in capo_envs.CATALOG:
        assert env_id in gym.registry


def test_terminated_on_answer(env_id):
    env = make(env_id)
    env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step("<answer>no idea</answer>")
    assert terminated and not truncated
    assert info["ended_by"] == "terminated" and info["metrics"]["answered"] == 1.0
    assert reward == info["metrics"]["em"]


def test_truncated_by_step_budget(env_id):
    env = make(env_id, max_steps=3)
    env.reset(seed=3)
    results = [env.step("<search>anything</search>") for _ in range(3)]
    assert [r[2] for r in results] == [False] * 3
    assert [r[3] for r in results] == [False, False, True]
    info = results[-1][4]
    assert info["ended_by"] == "step_budget"
    assert info["metrics"]["answered"] == 0.0 and info["metrics"]["em"] == 0.0
    with pytest.raises(RuntimeError, match="reset"):
        env.step("<answer>late</answer>")


def test_truncated_by_context_budget(env_id):
    env = make(env_id, max_steps=50, max_context_chars=2000)
    env.reset(seed=3)
    truncated, steps = False, 0
    while not truncated:
        _, _, terminated, truncated, info = env.step("<search>the</search>")
        steps += 1
        assert not terminated
    assert info["ended_by"] == "context_budget" and steps < 50


def test_invalid_action_costs_a_step_and_the_penalty(env_id):
    env = make(env_id, invalid_penalty=0.25)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("I think the answer is Paris.")
    assert reward == -0.25 and not terminated and not truncated
    assert info["step"] == 1 and info["action"] == {"name": "", "args": {}}
    assert "no action found" in info["invalid_reason"] and "<search>" in obs


def test_support_reward_pays_each_gold_passage_once():
    env = gym.make("capo/SynthHop-v0", size="tiny", k=1, question_kinds=["bridge-2"], support_reward=0.25)
    env.reset(seed=0)
    rewards = []
    while (action := env.unwrapped.expert_action()) is not None:
        _, reward, terminated, _, info = env.step(action)
        rewards.append(reward)
    assert rewards == [0.25, 0.25, 1.0] and info["metrics"]["em"] == 1.0  # two hops found, then the answer
    env.reset(seed=0)
    first = env.unwrapped._task.expert_queries[0]
    assert [env.step(f"<search>{first}</search>")[1] for _ in range(2)] == [0.25, 0.0]  # found already
    assert env.step("<search>zzz unrelated</search>")[1] == 0.0
    with pytest.raises(ValueError, match="support_reward"):
        gym.make("capo/SynthHop-v0", size="tiny", support_reward=-1)


def test_task_selection(env_id):
    env = make(env_id)
    ids = env.unwrapped.task_ids()
    _, info = env.reset(options={"task_id": ids[5]})
    assert info["task_id"] == ids[5]
    _, info = env.reset(options={"task_index": 7})
    assert info["task_id"] == ids[7]
    with pytest.raises(ValueError, match="unknown task_id"):
        env.reset(options={"task_id": "no-such-task"})
    with pytest.raises(ValueError, match="task_index"):
        env.reset(options={"task_index": len(ids)})
    first = [env.reset(seed=s)[1]["task_id"] for s in range(20)]
    again = [env.reset(seed=s)[1]["task_id"] for s in range(20)]
    assert first == again and len(set(first)) > 5


def test_reset_info_publishes_the_protocol(env_id):
    env = make(env_id)
    _, info = env.reset(seed=0)
    assert info["protocol"]["stop_strings"] == ["</search>", "</answer>"]
    assert info["protocol"] == env.unwrapped.protocol.describe()


@pytest.mark.parametrize("action_format", ["tags", "tool_call"])
def test_expert_solves_tiny(env_id, action_format):
    metrics = expert_metrics(make(env_id, action_format=action_format, split="dev"))
    assert all(m["answered"] == 1.0 for m in metrics)
    assert sum(m["em"] for m in metrics) / len(metrics) >= 0.95


def test_synthhop_oracle_reaches_em_095_with_bm25_top5():
    metrics = expert_metrics(gym.make("capo/SynthHop-v0", size="small", split="test", k=5))
    assert sum(m["em"] for m in metrics) / len(metrics) >= 0.95


def test_render_ansi_is_the_transcript(env_id):
    env = make(env_id, render_mode="ansi")
    obs, _ = env.reset(seed=0)
    env.step("<search>x</search>")
    text = env.render()
    assert text.startswith(obs) and "<search>x</search>" in text


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vector_envs(env_id, mode):
    fns = [lambda: make(env_id) for _ in range(2)]
    envs = (
        gym.vector.SyncVectorEnv(fns) if mode == "sync" else gym.vector.AsyncVectorEnv(fns, shared_memory=False)
    )
    try:
        obs, infos = envs.reset(seed=[0, 1])
        assert len(obs) == 2 and all(isinstance(o, str) for o in obs)
        episodes_done = 0
        for _ in range(12):
            # After an episode ends, the next vector step resets that env (Gymnasium's NEXT_STEP autoreset)
            # and its expert has nothing to say until then.
            actions = [a if a is not None else "" for a in envs.call("expert_action")]
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            assert rewards.shape == (2,) and all(isinstance(o, str) for o in obs)
            assert "action_valid" in infos or "protocol" in infos
            episodes_done += int(terminated.sum() + truncated.sum())
        assert episodes_done >= 2
    finally:
        envs.close()


def close_promptly(envs, timeout: float = 30.0) -> None:
    """Close a vector env in a thread, so that a hang (AsyncVectorEnv waiting on a dead step) fails the test
    instead of hanging CI."""
    closer = threading.Thread(target=envs.close, daemon=True)
    closer.start()
    closer.join(timeout)
    assert not closer.is_alive(), f"{type(envs).__name__}.close() still running after {timeout} s"


def make_vector(mode, fns):
    if mode == "sync":
        return gym.vector.SyncVectorEnv(fns)
    return gym.vector.AsyncVectorEnv(fns, shared_memory=False)


# Per sub-env action cycles (max_steps=3): sub-env 0 alternates invalid and valid and is truncated by the step
# budget, sub-env 1 is terminated by an answer on its third step, sub-env 2 answers at once (terminated every
# other vector step, autoreset in between), so steps mix valid, invalid, ended and autoreset sub-envs.
MIXED_CYCLES = (
    ("", "<search>x</search>", None),
    ("<search>a</search>", 10**5000, "<answer>b</answer>"),
    ("<answer>c</answer>",),
)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_vector_envs_mix_valid_and_invalid_actions(env_id, mode):
    envs = make_vector(mode, [lambda: make(env_id, max_steps=3) for _ in MIXED_CYCLES])
    try:
        envs.reset(seed=[0, 1, 2])
        ends = {"terminated": 0, "truncated": 0}
        valid_seen = invalid_seen = autoresets = 0
        for t in range(10):
            actions = [cycle[t % len(cycle)] for cycle in MIXED_CYCLES]
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            assert all(isinstance(o, str) for o in obs) and rewards.dtype == float
            ends["terminated"] += int(terminated.sum())
            ends["truncated"] += int(truncated.sum())
            autoresets += int(infos["_protocol"].sum()) if "_protocol" in infos else 0  # reset infos merged in
            stepped = infos.get("_action_valid", [False] * len(MIXED_CYCLES))
            for i in range(len(MIXED_CYCLES)):
                if not stepped[i]:
                    continue
                valid = bool(infos["action_valid"][i])
                valid_seen, invalid_seen = valid_seen + valid, invalid_seen + (not valid)
                name = infos["action"]["name"][i]
                assert isinstance(name, str) and (name != "") == valid
                assert (infos["invalid_reason"][i] == "") == valid
        assert valid_seen and invalid_seen and autoresets
        assert ends["terminated"] >= 3 and ends["truncated"] >= 1
    finally:
        close_promptly(envs)


class RecordingRetriever(Retriever):
    def __init__(self):
        self.closed = 0
        self.queries = []

    def search(self, queries, k):
        self.queries += list(queries)
        return [[Hit(str(i), f"T{i}", f"passage {i} about {q}", 1.0 / (i + 1)) for i in range(k)] for q in queries]

    def close(self):
        self.closed += 1


def test_close_releases_the_retriever_and_k_controls_passages():
    retriever = RecordingRetriever()
    env = MultiHopQAEnv([QATask("t1", "Who?", ("Ann",))], retriever, k=3, max_passage_chars=10)
    env.reset(seed=0)
    obs, *_ = env.step("<search>who</search>")
    assert retriever.queries == ["who"]
    assert obs.count("Doc ") == 3 and "Doc 4" not in obs
    assert "passage 0 ..." in obs  # passages are cut at max_passage_chars
    env.close()
    assert retriever.closed == 1


def test_forced_first_search_shows_passages_on_reset():
    retriever = RecordingRetriever()
    env = MultiHopQAEnv([QATask("t1", "Who wrote X?", ("Ann",))], retriever, forced_first_search=True)
    obs, _ = env.reset(seed=0)
    assert retriever.queries == ["Who wrote X?"] and "<information>" in obs


@pytest.mark.parametrize("env_id", ["capo/HotpotQA-v0", "capo/2WikiMultihopQA-v0", "capo/MuSiQue-v0"])
def test_public_ids_without_data_name_the_command(env_id, tmp_path, monkeypatch):
    monkeypatch.setenv("CAPO_DATA_DIR", str(tmp_path))
    dataset = capo_envs.CATALOG[env_id].kwargs["dataset"]
    with pytest.raises(DataNotPreparedError, match=f"capo data prepare {dataset}"):
        gym.make(env_id)
    assert not capo_envs.CATALOG[env_id].data_ready()
