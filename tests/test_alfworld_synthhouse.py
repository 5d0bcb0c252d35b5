"""capo/SynthHouse-v0: generated ALFWorld games, deterministic from a seed, that the real engine plays and the
handcoded expert wins (needs the ``alfworld`` extra; skipped without it)."""

from __future__ import annotations

import os
import random
import re
import time
from pathlib import Path

import gymnasium as gym
import pytest

from capo_envs.alfworld.engine import engine_available
from capo_envs.alfworld.env import TRANSFORMS
from capo_envs.alfworld.games import TASK_TYPE_NAMES

pytestmark = pytest.mark.skipif(not engine_available(), reason="the alfworld extra is not installed")


def test_games_are_deterministic_in_the_task_id_and_use_alfworlds_domain_and_grammar():
    from alfworld.info import ALFRED_PDDL_PATH

    from capo_envs.alfworld.world import make_game

    game, traj = make_game("synthhouse-small-0-train-3-pick_heat_then_place_in_recep", "pick_heat_then_place_in_recep")
    again, _ = make_game("synthhouse-small-0-train-3-pick_heat_then_place_in_recep", "pick_heat_then_place_in_recep")
    other, _ = make_game("synthhouse-small-0-train-9-pick_heat_then_place_in_recep", "pick_heat_then_place_in_recep")
    assert game == again and game["pddl_problem"] != other["pddl_problem"]
    assert game["pddl_domain"] == Path(ALFRED_PDDL_PATH).read_text() and game["solvable"] is True
    assert "UNKNOWN GOAL" not in game["grammar"] and traj["task_type"] == "pick_heat_then_place_in_recep"
    assert "(isHot ?o)" in game["pddl_problem"] and "(:domain alfred)" in game["pddl_problem"]
    assert "_bar_" in game["pddl_problem"]  # THOR-style ids, demangled by ALFWorld into "apple 1"


def test_every_task_type_translates_with_fast_downward():
    import fast_downward

    from capo_envs.alfworld.world import make_game

    for size in ("micro", "tiny", "large"):
        for task_type in TASK_TYPE_NAMES:
            game, _ = make_game(f"t-{size}-{task_type}", task_type, size)
            task, sas = fast_downward.pddl2sas(game["pddl_domain"], game["pddl_problem"])
            assert "begin_goal" in sas and len(task.objects) > 100


def test_task_ids_splits_types_and_kwargs():
    env = gym.make("capo/SynthHouse-v0", split="dev", num_tasks=12, task_types=[2, "pick_two_obj_and_place"])
    ids = env.unwrapped.task_ids()
    assert len(ids) == 12 and ids[0] == "synthhouse-small-0-dev-0-look_at_obj_in_light"
    assert {env.unwrapped.task_type(i) for i in ids} == {"look_at_obj_in_light", "pick_two_obj_and_place"}
    train = gym.make("capo/SynthHouse-v0", num_tasks=12).unwrapped.task_ids()
    assert not set(ids) & set(train)
    for bad in ({"size": "huge"}, {"split": "valid"}, {"task_types": [0]}, {"seed": "1"}, {"num_tasks": 0}):
        with pytest.raises(ValueError):
            gym.make("capo/SynthHouse-v0", **bad)
    for name, value in (("max_steps", 0), ("max_steps", True), ("max_steps", "5"), ("action_format", "xml"),
                        ("action_format", ["tags"])):
        with pytest.raises(ValueError, match=f"{name} must be .*, got {re.escape(repr(value))}"):
            gym.make("capo/SynthHouse-v0", **{name: value})
    env.close()


def test_expert_wins_a_sample_of_each_task_type():
    env = gym.make("capo/SynthHouse-v0", size="small", split="test")
    base = env.unwrapped
    for index in range(6):  # ids cycle through the six types
        obs, info = env.reset(options={"task_index": index})
        assert "Your task is to:" in obs and "Admissible commands:" in obs
        assert info["task_type"] == TASK_TYPE_NAMES[index]
        done = False
        while not done:
            _, reward, terminated, truncated, info = env.step(base.expert_action())
            assert info["action_valid"], info["invalid_reason"]
            done = terminated or truncated
        assert terminated and reward == 1.0 and info["metrics"]["success"] == 1.0, info["task_id"]
        assert base.expert_action() is None
    env.close()


def test_micro_rooms_hold_only_what_the_task_needs_and_the_expert_wins_each_type():
    """size="micro" (the CPU recipe's preset): the receptacles the task needs (the object's start, the task's
    receptacle, the appliance of a clean/heat/cool task or a lamp's stand), filled up to 3 a room, one other
    object; the handcoded expert wins each type."""
    from capo_envs.alfworld import synth
    from capo_envs.alfworld.world import SIZES, draw_house

    for task_type in TASK_TYPE_NAMES:
        for n in range(20):
            house = draw_house(task_type, random.Random(f"micro-{task_type}-{n}"), "micro")
            assert len(house.receptacles) == 3 and len(house.objects) <= 5, (task_type, house.receptacles)
            kinds = {rtype for _, rtype, _ in house.receptacles}
            assert (house.parent in kinds) == bool(house.parent)
    assert SIZES["micro"]["receptacles"] < SIZES["tiny"]["receptacles"]
    assert synth.SIZES == tuple(SIZES)  # the env checks `size` against its own copy of the names
    env = gym.make("capo/SynthHouse-v0", size="micro", split="dev", max_steps=20)
    base = env.unwrapped
    for index in range(6):
        obs, info = env.reset(options={"task_index": index})
        assert obs.count("go to ") == 3, obs  # "Admissible commands: go to cabinet 1, go to fridge 1, ..."
        done = False
        while not done:
            _, reward, terminated, truncated, info = env.step(base.expert_action())
            done = terminated or truncated
        assert terminated and info["metrics"]["success"] == 1.0, info["task_id"]
    env.close()


def test_same_task_same_game_and_the_expert_replays_the_same_walkthrough():
    env = gym.make("capo/SynthHouse-v0", size="tiny", split="dev")
    walks = []
    for _ in range(2):
        obs, _ = env.reset(options={"task_index": 5})
        walk = [obs]
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(env.unwrapped.expert_action())
            walk.append(obs)
            done = terminated or truncated
        walks.append(walk)
    assert walks[0] == walks[1] and terminated
    env.close()


def test_skip_transform_demonstrator_skips_only_the_transform_and_then_gives_up():
    """mistake="skip-transform": random_action is None until the expert would heat, cool or clean; there it goes to
    the task's receptacle instead, and once that is played expert_action plays the same belief (move the object
    there), then gives up (None from both: the demonstration ends, the game not won; it does not wait out the
    steps with look, which its clone copied as a habit of repeating itself); the default mistake stays a random
    admissible command."""
    env = gym.make("capo/SynthHouse-v0", size="tiny", split="dev", max_steps=20, task_types=[3, 4, 5],
                   mistake="skip-transform")
    base, rng = env.unwrapped, random.Random(0)
    for index in range(3):  # clean, heat, cool
        obs, _ = env.reset(options={"task_index": index})
        receptacle = obs.split("Your task is to: ")[1].split(".")[0].split()[-1]  # "... put it in sidetable."
        commands, skipped_at, done = [], None, False
        while not done:
            expert = base.expert_action()
            mistake = base.random_action(rng)
            if expert is None:  # gave up: only after the skip's move
                assert mistake is None and skipped_at is not None
                break
            if mistake is None:
                assert bare(expert).split()[0] not in TRANSFORMS
            elif skipped_at is None:  # the skip: where the expert would transform the object
                skipped_at = len(commands)
                assert bare(expert).split()[0] in TRANSFORMS
                assert base.expert_action() == expert  # proposing the skip changes nothing until it is played
            else:  # once played, the expert plays the same belief
                assert mistake == expert
            _, _, terminated, truncated, info = env.step(mistake or expert)
            assert info["action_valid"], info["invalid_reason"]
            commands.append(info["command"])
            done = terminated or truncated
        assert not done and len(commands) < 20, commands  # it stopped before the step limit, the game not won
        assert commands[skipped_at].startswith(f"go to {receptacle} ")
        moved = [c for c in commands[skipped_at:] if c.startswith(("move ", "put "))]
        assert len(moved) == 1 and receptacle in moved[0] and commands[-1] == moved[0]
        assert not any(c.split()[0] in TRANSFORMS for c in commands)
    plain = gym.make("capo/SynthHouse-v0", size="tiny", split="dev", max_steps=20)
    plain.reset(options={"task_index": 0})
    assert bare(plain.unwrapped.random_action(rng)) in plain.unwrapped.available_actions()
    with pytest.raises(ValueError, match="mistake"):
        gym.make("capo/SynthHouse-v0", mistake="forget")
    env.close()
    plain.close()


def test_listed_search_demonstrator_searches_in_the_rooms_order_then_hands_over_to_the_expert():
    """expert_mode="listed-search": until it holds the task's object, the demonstrator goes to the receptacles in
    the order the room's first description lists them (opening closed ones) and takes the object where it
    shows one, which a reader of the observations can do (the handcoded expert's search order is its own);
    then the handcoded expert finishes. It wins as often as the expert on the transform tasks."""
    from alfworld.gen.goal_library import gdict

    from capo_envs.alfworld.env import TASK_OBJECT

    for name in TASK_TYPE_NAMES:  # the object type of every template of every task type
        for template in gdict[name]["templates"]:
            sentence = "Your task is to: " + template.format(obj="apple", recep="fridge", toggle="desklamp", mrecep="")
            assert TASK_OBJECT.search(sentence).group(1) == "apple", sentence
    env = gym.make("capo/SynthHouse-v0", size="tiny", split="dev", max_steps=20, task_types=[3, 4, 5],
                   expert_mode="listed-search")
    base, wins = env.unwrapped, 0
    for index in range(12):
        obs, _ = env.reset(options={"task_index": index})
        listed = [p.removeprefix("a ").removeprefix("an ").removeprefix("and a ")
                  for p in obs.split("you see ")[1].split(".")[0].split(", ")]
        target = base._target
        assert target and target in obs.split("Your task is to: ")[1] and len(listed) >= 3
        visited, took, done = [], False, False
        while not done:
            command = bare(base.expert_action())
            if not took:
                at_place = visited[-1] if visited else None
                if command.startswith("go to "):
                    assert command[6:] == [p for p in listed if p not in visited][0]
                    visited.append(command[6:])
                elif command.startswith("take "):
                    assert command.split()[1] == target and command.endswith(f"from {at_place}")
                    took = True
                else:
                    assert command == f"open {at_place}"
            _, _, terminated, truncated, info = env.step(f"<action>{command}</action>")
            assert info["action_valid"], info.get("invalid_reason")
            done = terminated or truncated
        assert took
        wins += info["metrics"]["success"]
    assert wins >= 11
    with pytest.raises(ValueError, match="expert_mode"):
        gym.make("capo/SynthHouse-v0", expert_mode="oracle")
    env.close()


def bare(action: str) -> str:
    return action.removeprefix("<action>").removesuffix("</action>")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_memory_stays_flat_over_1000_resets():
    env = gym.make("capo/SynthHouse-v0", size="tiny", split="dev", num_tasks=4)
    for i in range(100):  # warm-up: every task generated, checked and cached
        env.reset(options={"task_index": i % 4})
        env.step("<action>look</action>")
    pid = env.unwrapped.engine_pid
    before = rss_mb(os.getpid()) + rss_mb(pid)
    for i in range(1000):
        env.reset(options={"task_index": i % 4})
    after = rss_mb(os.getpid()) + rss_mb(env.unwrapped.engine_pid)
    assert env.unwrapped.engine_pid == pid
    assert after - before < 25, f"RSS grew from {before:.0f} MB to {after:.0f} MB over 1,000 resets"
    env.close()


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_vector_envs_close_their_engines_and_orphans_exit():
    make = lambda: gym.make("capo/SynthHouse-v0", size="tiny", num_tasks=3)  # noqa: E731
    sync = gym.vector.SyncVectorEnv([make, make])
    sync.reset(seed=[0, 1])
    sync.step([a or "" for a in sync.call("expert_action")])
    pids = sync.call("engine_pid")
    sync.close()
    assert all(pid is not None for pid in pids) and not any(alive(pid) for pid in pids)
    # An AsyncVectorEnv whose workers die without closing: each engine reads the end of its input and exits.
    envs = gym.vector.AsyncVectorEnv([make, make], shared_memory=False)
    envs.reset(seed=[0, 1])
    pids = envs.call("engine_pid")
    for process in envs.processes:
        process.kill()
    deadline = time.monotonic() + 20
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("action_format", ["tags", "tool_call"])
def test_gymnasium_check_env(action_format):
    from gymnasium.utils.env_checker import check_env

    env = gym.make("capo/SynthHouse-v0", size="tiny", action_format=action_format, disable_env_checker=True)
    check_env(env.unwrapped, skip_render_check=False)
    env.close()


def test_the_capo_paper_preset():
    from capo_envs.alfworld.env import PRESETS

    env = gym.make("capo/SynthHouse-v0", size="tiny", **PRESETS["capo"]).unwrapped
    assert env.max_steps == 20 and env.protocol.stop_strings == ("</tool_call>",) and env.win_reward == 1.0
    assert gym.make("capo/SynthHouse-v0", **PRESETS["verl-agent"]).unwrapped.win_reward == 10.0


def kill_engine(env) -> int:
    import signal

    pid = env.unwrapped.engine_pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return pid


def test_a_step_that_finds_the_engine_dead_says_it_died_and_ends_the_episode():
    env = gym.make("capo/SynthHouse-v0", size="tiny", num_tasks=3)
    env.reset(seed=0)
    pid = kill_engine(env)  # the OOM killer, a stray kill: between two steps
    obs, reward, terminated, truncated, info = env.step("<action>look</action>")
    assert truncated and not terminated and reward == 0.0 and info["ended_by"] == "engine_error"
    assert "the engine process died (killed by SIGKILL) before 'step'" in obs, obs
    assert "died (killed by SIGKILL)" in info["engine_error"] and "no game loaded" not in obs
    assert info["metrics"]["steps"] == 1.0 and env.unwrapped.engine_pid is None  # no process restarted for nothing
    obs, info = env.reset(seed=0)  # the next episode in a fresh process
    assert obs.startswith("-= Welcome") and env.unwrapped.engine_pid not in (None, pid)
    env.close()


def test_a_reset_that_finds_the_engine_dead_restarts_it_and_says_so():
    env = gym.make("capo/SynthHouse-v0", size="tiny", num_tasks=3)
    env.reset(options={"task_index": 0})
    pid = kill_engine(env)
    obs, info = env.reset(options={"task_index": 0})  # the same task: a plain "reset" would have gone to the dead one
    assert obs.startswith("-= Welcome") and env.unwrapped.engine_pid not in (None, pid)
    assert "the engine process died (killed by SIGKILL)" in info["engine_restarted"]
    _, _, _, truncated, info = env.step("<action>look</action>")
    assert info["action_valid"] and not truncated
    assert "engine_restarted" not in env.reset(options={"task_index": 1})[1]  # said once, for the reset that found it
    env.close()


def test_a_demonstration_ends_where_the_demonstrator_gives_up(capsys):
    """The warm start's demonstrations (and `capo demo`) end at the step where the demonstrator gives up
    (skip-transform, after its move): no action is recorded after the move and the trajectory is cut
    (truncated, no metrics: lost), while the other episodes play to the end."""
    pytest.importorskip("torch")
    from capo_train.cli import main
    from capo_train.models.tiny import make_tiny_tokenizer
    from capo_train.sft import expert_trajectories

    env = gym.make("capo/SynthHouse-v0", size="tiny", split="train", max_steps=20, task_types=[3, 4, 5],
                   mistake="skip-transform")
    tokenizer = make_tiny_tokenizer()
    trajectories = expert_trajectories(env, tokenizer, episodes=4, seed=0, expert_skill=0.0, state="window", window=2)
    env.close()
    for trajectory in trajectories:  # skill 0: every episode skips its transform
        last = trajectory.actions[-1]
        assert trajectory.truncated and not trajectory.terminated and trajectory.metrics == {}
        assert bare(tokenizer.decode(last.action_ids)).startswith(("move ", "put ")), tokenizer.decode(last.action_ids)
        assert len(trajectory.actions) < 20 and last.action_valid and last.reward == 0.0
    assert main(["demo", "--env", "capo/SynthHouse-v0", "--episodes", "2", "--expert-skill", "0", "size=tiny",
                 "max_steps=20", "task_types=[3, 4, 5]", "mistake=skip-transform"]) == 0
    out = capsys.readouterr().out
    assert out.count("the demonstrator gives up") == 2 and "success over 2 episodes: 0.00" in out
