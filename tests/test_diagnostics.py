"""The diagnostic envs (capo/SynthChain-v0, capo/SynthLength-v0, capo/SynthTrap-v0): contract, oracle,
random baselines against theory, splits, determinism, invalid actions, vector envs."""

import itertools
import math
import os
import random
import re
import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import capo_envs
from capo_envs.diagnostics.env import SynthChainEnv, SynthLengthEnv, SynthTrapEnv

IDS = ("capo/SynthChain-v0", "capo/SynthLength-v0", "capo/SynthTrap-v0")
INFO_KEYS = {"task_id", "step", "action_valid", "action", "invalid_reason"}
HOSTILE = [
    "", " ", "\n", "x" * 100_000, "<go>", "<go></go>", "<go><go>left</go></go>", "<pick>0</pick>", "<pick>99</pick>",
    "<pick>-1</pick>", "<pick>1.0</pick>", "<answer>10</answer>", "<answer>0</answer>", "<write></write>",
    "<go>purple</go>", "<GO>left</GO>", "ANSWER: 3", "<answer>1</answer><answer>2</answer>", "\ud800", "\x00",
    "<tool_call>{}</tool_call>", '<tool_call>{"name": "pick", "arguments": {"number": 1}}</tool_call>',
    None, 42, 3.5, b"<go>left</go>", ["<go>left</go>"], {"name": "go"},
]  # fmt: skip


def make(env_id, **kwargs):
    return gym.make(env_id, **{"num_tasks": 200, **kwargs})


def play(env, policy, *, seed=None, task_id=None):
    """One episode; returns (observations, rewards, the last step's (terminated, truncated), the last info)."""
    options = {"task_id": task_id} if task_id else None
    obs, info = env.reset(seed=seed, options=options)
    observations, rewards = [obs], []
    while True:
        obs, reward, terminated, truncated, info = env.step(policy(env.unwrapped, obs))
        observations.append(obs)
        rewards.append(reward)
        assert not (terminated and truncated)
        if terminated or truncated:
            return observations, rewards, (terminated, truncated), info


def expert(base, obs):
    return base.expert_action()


def random_policy(seed=0):
    rng = random.Random(seed)
    return lambda base, obs: base.random_action(rng)


def copy_shown(seed=0):
    """SynthLength: a random pick, then an exact copy of the record shown."""
    rng = random.Random(seed)

    def policy(base, obs):
        shown = re.search(r"\): (.*)\. Copy its text\.$", obs)
        return f"<write>{shown.group(1)}</write>" if shown else base.random_action(rng)

    return policy


def shortcut(base, obs):
    return base.shortcut_action()


# ----------------------------------------------------------------------------------------------- contract


@pytest.mark.parametrize("env_id", IDS)
def test_check_env_and_registration(env_id):
    assert env_id in capo_envs.CATALOG and env_id in gym.registry
    env = make(env_id, disable_env_checker=True)
    check_env(env.unwrapped, skip_render_check=False)


@pytest.mark.parametrize("env_id", IDS)
def test_contract_types_info_keys_and_exact_horizon(env_id):
    env = make(env_id)
    horizon = env.unwrapped.horizon
    for policy in (expert, random_policy(1), lambda base, obs: "no action here"):
        for seed in range(5):
            obs, info = env.reset(seed=seed)
            assert isinstance(obs, str) and info["task_id"] in env.unwrapped.task_ids()
            assert info["protocol"] == env.unwrapped.protocol.describe()
            for t in range(1, horizon + 1):
                obs, reward, terminated, truncated, info = env.step(policy(env.unwrapped, obs))
                assert isinstance(obs, str) and obs in env.observation_space and isinstance(reward, float)
                assert INFO_KEYS <= set(info) and info["step"] == t
                assert terminated == (t == horizon) and not truncated  # the horizon is the task: never truncated
                if not terminated:
                    assert ("available_actions" in info) == (env.unwrapped.available_actions() is not None)
            assert info["ended_by"] == "terminated" and info["metrics"]["steps"] == horizon
            assert 0.0 <= info["metrics"]["success"] <= 1.0
            with pytest.raises(RuntimeError, match="reset"):
                env.step("<go>left</go>")


@pytest.mark.parametrize("env_id", IDS)
def test_available_actions_are_the_legal_set(env_id):
    env = make(env_id)
    _, info = env.reset(seed=0)
    for action in info["available_actions"]:
        env.reset(seed=0)
        assert env.step(action)[4]["action_valid"], action


@pytest.mark.parametrize("env_id", IDS)
def test_default_observations_are_short(env_id):
    env = make(env_id)
    longest = 0
    for policy in (expert, random_policy(2), lambda base, obs: "ANSWER: 3"):
        for seed in range(50):
            observations, *_ = play(env, policy, seed=seed)
            longest = max(longest, *map(len, observations))
    assert longest < 200


# ----------------------------------------------------------------------------------------------- oracle


def assert_expert_solves(env, episodes=3):
    for index in range(episodes):
        _, rewards, _, info = play(env, expert, task_id=env.unwrapped.task_ids()[index])
        assert info["metrics"]["success"] == 1.0 and info["metrics"]["invalid_actions"] == 0.0
        assert math.isclose(sum(rewards), 1.0)


def test_expert_solves_every_chain_setting():
    settings = itertools.product(range(1, 17), (2, 3, 4), ("fraction", "all"), (False, True))
    for k, choices, reward, distractor in settings:
        env = SynthChainEnv(k=k, choices=choices, reward=reward, distractor=distractor, num_tasks=3)
        assert_expert_solves(env)


def test_expert_solves_every_length_setting():
    settings = itertools.product(range(2, 10), range(1, 65), ("f1", "exact"), ("tags", "tool_call"))
    for n, (records, long_words, reward, action_format) in enumerate(settings):
        texts, ask_by = ("copy", "recall")[n % 2], ("name", "number")[n // 2 % 2]
        env = SynthLengthEnv(
            records, long_words, reward, texts=texts, ask_by=ask_by, num_tasks=2, action_format=action_format
        )
        assert_expert_solves(env, episodes=2)


def test_expert_solves_every_trap_setting():
    for steps, temptation, penalty in itertools.product(range(1, 17), (0.0, 0.3, 0.5, 1.0), (0.0, 0.5)):
        assert_expert_solves(SynthTrapEnv(steps=steps, temptation=temptation, invalid_penalty=penalty, num_tasks=3))


# ------------------------------------------------------------------------------------- random baselines


def mean_success(env, policy, episodes=2000):
    return sum(play(env, policy, seed=s)[3]["metrics"]["success"] for s in range(episodes)) / episodes


def near(measured, p, episodes=2000):
    """Within 4.5 standard errors of a binomial mean p."""
    return abs(measured - p) <= 4.5 * math.sqrt(p * (1 - p) / episodes) + 1e-9


@pytest.mark.parametrize(
    "env_id, kwargs, policy, theory",
    [
        ("capo/SynthChain-v0", {"k": 2}, random_policy(), 0.25),
        ("capo/SynthChain-v0", {"k": 3, "choices": 3, "distractor": True}, random_policy(), 1 / 27),
        ("capo/SynthLength-v0", {"records": 3}, copy_shown(), 1 / 3),
        ("capo/SynthLength-v0", {}, random_policy(), 0.0),
        ("capo/SynthTrap-v0", {"steps": 1}, random_policy(), 1 / 9),
        ("capo/SynthTrap-v0", {"steps": 2, "temptation": 0.5}, shortcut, 0.25),
        ("capo/SynthTrap-v0", {"steps": 3, "temptation": 0.2}, shortcut, 0.8**3),
    ],
)
def test_baseline_success_matches_theory(env_id, kwargs, policy, theory):
    assert near(mean_success(make(env_id, **kwargs, num_tasks=10_000), policy), theory)


def test_random_chain_gets_half_the_doors_right_and_a_fraction_reward():
    env = make("capo/SynthChain-v0", k=8)
    fractions = []
    for seed in range(500):
        _, rewards, _, info = play(env, random_policy(seed), seed=seed)
        assert rewards[:-1] == [0.0] * 7 and rewards[-1] == info["metrics"]["correct_fraction"]  # outcome only
        fractions.append(rewards[-1])
    assert abs(sum(fractions) / len(fractions) - 0.5) < 0.03
    env = make("capo/SynthChain-v0", k=8, reward="all")
    _, rewards, _, info = play(env, random_policy(), seed=0)
    assert rewards[-1] == info["metrics"]["success"] == 0.0 < info["metrics"]["correct_fraction"]


def test_a_wrong_pick_spoils_the_long_write():
    env = make("capo/SynthLength-v0", records=4, long_words=32)
    env.reset(seed=0)
    right = env.unwrapped.expert_action()
    wrong = next(a for a in env.unwrapped.available_actions() if a != right)
    obs = env.step(wrong)[0]
    copied = re.search(r"\): (.*)\. Copy its text\.$", obs).group(1)
    _, reward, terminated, _, info = env.step(f"<write>{copied}</write>")
    metrics = info["metrics"]
    assert terminated and metrics["pick_correct"] == 0.0 and metrics["success"] == 0.0
    assert reward == 0.0  # only a write after the right pick scores
    assert metrics["write_f1"] < 0.6  # the write alone, against the right text: the shown one is another record's


def test_a_wrong_pick_scores_nothing_even_with_the_right_text():
    env = make("capo/SynthLength-v0", records=4, long_words=8)
    env.reset(seed=3)
    right = env.unwrapped.expert_action()
    env.step(right)
    right_text = re.search(r"<write>(.*)</write>", env.unwrapped.oracle_action()).group(1)
    env.reset(seed=3)  # the same task again
    env.step(next(a for a in env.unwrapped.available_actions() if a != right))
    _, reward, _, _, info = env.step(f"<write>{right_text}</write>")
    assert reward == 0.0 and info["metrics"]["success"] == 0.0 and info["metrics"]["write_f1"] == 1.0


def test_recall_texts_are_one_per_animal_and_never_shown():
    """texts="recall": an animal's text is the same in every task and split of a seed, and differs across seeds."""
    texts_by_seed = []
    for seed in (0, 1):
        texts = {}
        for split in ("train", "dev"):
            env = make("capo/SynthLength-v0", texts="recall", ask_by="number", long_words=8, seed=seed, split=split)
            for task in range(40):
                obs, _ = env.reset(seed=task)
                asked = int(re.search(r"Pick record (\d)\.$", obs).group(1))
                animal = re.search(rf"{asked} (\w+)", obs).group(1)
                obs = env.step(env.unwrapped.oracle_action())[0]
                assert obs == f"Record {asked} ({animal}). Write its text."  # recalled, not copied
                text = re.search(r"<write>(.*)</write>", env.unwrapped.oracle_action()).group(1)
                assert texts.setdefault(animal, text) == text and len(text.split()) == 8
                assert env.step(f"<write>{text}</write>")[1] == 1.0
        texts_by_seed.append(texts)
    shared = texts_by_seed[0].keys() & texts_by_seed[1].keys()
    assert len(shared) >= 10 and all(texts_by_seed[0][a] != texts_by_seed[1][a] for a in shared)


def test_ask_by_changes_only_how_the_record_is_named():
    by_name = make("capo/SynthLength-v0", ask_by="name")
    by_number = make("capo/SynthLength-v0", ask_by="number")
    for task in range(20):
        name_obs, _ = by_name.reset(seed=task)
        number_obs, _ = by_number.reset(seed=task)
        assert name_obs.split(". Pick")[0] == number_obs.split(". Pick")[0]  # the same listing
        assert by_name.unwrapped.oracle_action() == by_number.unwrapped.oracle_action()
        assert re.search(r"Pick the \w+\.$", name_obs) and re.search(r"Pick record \d\.$", number_obs)


# ----------------------------------------------------------------------------------------- splits, seeds


@pytest.mark.parametrize("env_id", IDS)
def test_splits_are_disjoint(env_id):
    splits = ("train", "dev", "test")
    ids = {split: set(make(env_id, split=split, num_tasks=None).unwrapped.task_ids()) for split in splits}
    assert [len(ids[s]) for s in ("train", "dev", "test")] == [10_000, 500, 500]
    assert not (ids["train"] & ids["dev"] or ids["train"] & ids["test"] or ids["dev"] & ids["test"])
    with pytest.raises(ValueError, match="split"):
        make(env_id, split="validation")


def test_split_contents_are_disjoint():
    texts = {}
    for split in ("train", "dev", "test"):
        env = make("capo/SynthLength-v0", split=split, num_tasks=300)
        texts[split] = {play(env, expert, task_id=t)[0][1] for t in env.unwrapped.task_ids()}
        assert len(texts[split]) == 300
    assert not (texts["train"] & texts["dev"] or texts["train"] & texts["test"] or texts["dev"] & texts["test"])


@pytest.mark.parametrize("env_id", IDS)
def test_tasks_are_determined_by_seed(env_id):
    def transcripts(**kwargs):
        env = make(env_id, **kwargs)
        return [play(env, random_policy(s), seed=s)[0] for s in range(20)]

    assert transcripts() == transcripts()
    assert transcripts(seed=1) != transcripts()
    env = make(env_id)
    ids = env.unwrapped.task_ids()
    assert env.reset(options={"task_id": ids[7]})[1]["task_id"] == ids[7]
    with pytest.raises(ValueError, match="unknown task_id"):
        env.reset(options={"task_id": "synthchain-0-train-999999"})


def test_tasks_are_the_same_in_another_process_with_another_hash_seed_and_torch_is_not_imported():
    code = (
        "import sys, gymnasium as gym, capo_envs\n"
        "for env_id in ('capo/SynthChain-v0', 'capo/SynthLength-v0', 'capo/SynthTrap-v0'):\n"
        "    print(repr(gym.make(env_id).reset(seed=5)[0]))\n"
        "assert 'torch' not in sys.modules and 'capo_train' not in sys.modules\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONHASHSEED": "12345"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    here = [repr(gym.make(env_id).reset(seed=5)[0]) for env_id in IDS]
    assert out.stdout.splitlines() == here


# --------------------------------------------------------------------------------------- invalid actions


@pytest.mark.parametrize("env_id", IDS)
def test_hostile_actions_never_crash_and_are_invalid(env_id):
    env = make(env_id, invalid_penalty=0.5)
    env.reset(seed=0)
    for n, action in enumerate(HOSTILE * 10):
        if n % 3 == 2 and any(env.step(env.unwrapped.expert_action())[2:4]):  # a valid action now and then
            env.reset()
        obs, reward, terminated, truncated, info = env.step(action)
        assert isinstance(obs, str) and isinstance(reward, float) and INFO_KEYS <= set(info)
        assert not info["action_valid"] and info["invalid_reason"], action
        assert obs.startswith("Invalid action:")
        assert reward == -0.5 if not terminated else -0.5 <= reward <= 0.5  # the last step adds the outcome
        if terminated or truncated:
            env.reset()


def test_an_invalid_chain_step_is_a_wrong_decision_and_shows_the_next_sign():
    env = make("capo/SynthChain-v0", k=3, invalid_penalty=0.1)
    env.reset(seed=0)
    obs, reward, terminated, _, info = env.step("<go>purple</go>")  # well formed, but no such door
    assert not info["action_valid"] and "no 'purple' door" in info["invalid_reason"]
    assert reward == -0.1 and not terminated and "Step 2/3" in obs and "sign points" in obs
    env.step(env.unwrapped.expert_action())
    obs, reward, terminated, truncated, info = env.step("I'd go left")  # the last decision, invalid
    assert terminated and not truncated and info["ended_by"] == "terminated"
    assert info["metrics"]["correct_fraction"] == pytest.approx(1 / 3) and info["metrics"]["invalid_actions"] == 2
    assert reward == pytest.approx(1 / 3 - 0.1)  # the outcome reward is still paid, minus the penalty


def test_length_rejects_the_wrong_tool_and_out_of_range_picks():
    env = make("capo/SynthLength-v0", records=4)
    env.reset(seed=0)
    assert "pick a number from 1 to 4" in env.step("<pick>5</pick>")[4]["invalid_reason"]
    obs, _, terminated, _, info = env.step("<pick>1</pick>")  # the write step: a pick is not possible now
    assert not info["action_valid"] and "write instead" in info["invalid_reason"] and terminated
    assert info["metrics"] == {
        "success": 0.0, "pick_correct": 0.0, "write_f1": 0.0, "steps": 2.0, "invalid_actions": 2.0
    }  # fmt: skip
    env.reset(seed=0)
    assert not env.step("<write>too early</write>")[4]["action_valid"]


def test_trap_shortcut_is_invalid_and_counted():
    env = make("capo/SynthTrap-v0", steps=4, temptation=1.0, invalid_penalty=0.2)
    obs, _ = env.reset(seed=3)
    assert "Shortcut: reply ANSWER:" in obs
    total = 0.0
    for action in ("ANSWER: 4", "<answer>x</answer>", env.unwrapped.shortcut_action(), None):
        action = action or env.unwrapped.expert_action()
        obs, reward, terminated, _, info = env.step(action)
        total += reward
    metrics = info["metrics"]
    assert terminated and metrics["invalid_actions"] == 3 and metrics["invalid_rate"] == 0.75
    assert metrics["shortcut_rate"] == 0.5 and metrics["success"] == 0.0 and metrics["correct_fraction"] == 0.25
    assert total == pytest.approx(0.25 - 3 * 0.2)
    never = make("capo/SynthTrap-v0", temptation=0.0)
    assert all("Shortcut" not in o for s in range(30) for o in play(never, expert, seed=s)[0])


@pytest.mark.parametrize(
    "env_id, bad",
    [
        ("capo/SynthChain-v0", {"k": 0}), ("capo/SynthChain-v0", {"k": 17}), ("capo/SynthChain-v0", {"choices": 5}),
        ("capo/SynthChain-v0", {"reward": "sum"}), ("capo/SynthChain-v0", {"distractor": 1}),
        ("capo/SynthChain-v0", {"action_format": "tool_call"}), ("capo/SynthLength-v0", {"long_words": 65}),
        ("capo/SynthLength-v0", {"records": 1}), ("capo/SynthLength-v0", {"action_format": "json"}),
        ("capo/SynthLength-v0", {"texts": "shown"}), ("capo/SynthLength-v0", {"ask_by": "colour"}),
        ("capo/SynthTrap-v0", {"temptation": 1.5}), ("capo/SynthTrap-v0", {"steps": True}),
        ("capo/SynthTrap-v0", {"num_tasks": 0}), ("capo/SynthTrap-v0", {"invalid_penalty": -1}),
    ],
)  # fmt: skip
def test_bad_knobs_raise_clear_errors(env_id, bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        make(env_id, **bad)


# ------------------------------------------------------------------------------------------- vector envs


def test_sync_vector_env():
    fns = [lambda env_id=env_id: make(env_id) for env_id in IDS]
    envs = gym.vector.SyncVectorEnv(fns)
    try:
        obs, _ = envs.reset(seed=[0, 1, 2])
        assert len(obs) == 3 and all(isinstance(o, str) for o in obs)
        ended = 0
        for _ in range(20):
            # after an episode ends, the next vector step resets that env (NEXT_STEP autoreset)
            actions = [a if a is not None else "" for a in envs.call("expert_action")]
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            assert rewards.shape == (3,) and not (terminated & truncated).any()
            ended += int(terminated.sum())
            assert all(isinstance(o, str) for o in obs)
        assert ended >= 3 and not truncated.any()
    finally:
        envs.close()


# ------------------------------------------------------------------------------------- erring demonstrator


@pytest.mark.parametrize("skill, expected", [(1.0, 1.0), (0.5, 0.75), (0.0, 0.5)])
def test_expert_skill_mixes_oracle_and_random_legal_actions(skill, expected):
    """SynthChain k=1, 2 doors: the demonstrator is right with probability skill + (1 - skill) / 2, and always
    sends a legal action (a format-only warm start at skill 0)."""
    env = make("capo/SynthChain-v0", k=1, expert_skill=skill, num_tasks=2000)
    right, episodes = 0, 2000
    for n in range(episodes):
        _, _, _, info = play(env, expert, seed=n)
        assert info["action_valid"]
        right += info["metrics"]["success"]
    assert abs(right / episodes - expected) < 4.5 * math.sqrt(expected * (1 - expected) / episodes) + 1e-9


def test_expert_skill_is_reproducible_by_reset_seed():
    env = make("capo/SynthChain-v0", k=8, expert_skill=0.3)
    first = play(env, expert, seed=5)[0]
    assert play(env, expert, seed=5)[0] == first


def test_expert_skill_out_of_range_is_a_clear_error():
    with pytest.raises(ValueError, match="expert_skill"):
        make("capo/SynthChain-v0", expert_skill=1.5)
