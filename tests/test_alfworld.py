"""capo/ALFWorld-v0: game discovery with the official filter, clear errors, and the contract on the real engine.

The engine tests need the ``alfworld`` extra (skipped without it); the real-game test also needs
``../shared/data/alfworld`` (a folder in the ``$ALFWORLD_DATA`` layout holding one released game).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import gymnasium as gym
import pytest

import capo_envs
from capo_envs.alfworld.engine import engine_available
from capo_envs.alfworld.games import NoGamesError, count_games, find_games, resolve_task_types
from capo_envs.core import DataNotPreparedError

SHARED = Path(__file__).resolve().parents[2] / "shared"
REAL = SHARED / "data" / "alfworld"
REAL_TRIAL = "pick_heat_then_place_in_recep-Potato-None-SinkBasin-14/trial_T20190908_231731_054988"
needs_engine = pytest.mark.skipif(not engine_available(), reason="the alfworld extra is not installed")
needs_real_game = pytest.mark.skipif(not (REAL / "json_2.1.1").is_dir(), reason="../shared/data/alfworld is absent")


def write_trial(root: Path, split: str, folder: str, task_type: str, game: dict | None) -> Path:
    trial = root / "json_2.1.1" / split / folder / "trial_T1"
    trial.mkdir(parents=True)
    (trial / "traj_data.json").write_text(json.dumps({"task_type": task_type, "pddl_params": {}}))
    if game is not None:
        (trial / "game.tw-pddl").write_text(json.dumps(game))
    return trial


def test_find_games_applies_the_official_filter(tmp_path):
    ok = {"pddl_domain": "", "grammar": "", "pddl_problem": "", "solvable": True}
    write_trial(tmp_path, "train", "pick_and_place_simple-Apple-None-Fridge-1", "pick_and_place_simple", ok)
    write_trial(tmp_path, "train", "pick_heat_then_place_in_recep-Egg-None-Fridge-2", "pick_heat_then_place_in_recep", ok)
    write_trial(tmp_path, "train", "pick_and_place_with_movable_recep-Apple-Bowl-Fridge-1", "pick_and_place_with_movable_recep", ok)
    write_trial(tmp_path, "train", "pick_clean_then_place_in_recep-AppleSliced-None-Fridge-1", "pick_clean_then_place_in_recep", ok)
    write_trial(tmp_path, "train", "pick_cool_then_place_in_recep-Apple-None-Fridge-3", "pick_cool_then_place_in_recep", {**ok, "solvable": False})
    write_trial(tmp_path, "train", "pick_cool_then_place_in_recep-Apple-None-Fridge-4", "pick_cool_then_place_in_recep", {"pddl_problem": ""})
    write_trial(tmp_path, "train", "pick_two_obj_and_place-Apple-None-Fridge-5", "pick_two_obj_and_place", None)
    games = find_games(tmp_path, "train")
    assert [g.task_type for g in games] == ["pick_and_place_simple", "pick_heat_then_place_in_recep"]
    assert games[0].task_id == "pick_and_place_simple-Apple-None-Fridge-1/trial_T1"
    assert [g.task_type for g in find_games(tmp_path, "train", resolve_task_types([4]))] == ["pick_heat_then_place_in_recep"]
    assert count_games(tmp_path) == {"train": 2, "valid_seen": 0, "valid_unseen": 0}


def test_zero_games_is_an_error_naming_the_folder_not_a_spin(tmp_path):
    write_trial(tmp_path, "valid_seen", "pick_and_place_simple-Apple-None-Fridge-1", "pick_and_place_simple", {"pddl_problem": ""})
    with pytest.raises(NoGamesError) as caught:
        find_games(tmp_path, "dev")  # dev = valid_seen
    message = str(caught.value)
    assert str(tmp_path / "json_2.1.1" / "valid_seen") in message and "no 'solvable' key" in message
    assert "capo data prepare alfworld" in message
    with pytest.raises(NoGamesError, match="missing folder"):
        gym.make("capo/ALFWorld-v0", data_dir=tmp_path / "nowhere")
    assert isinstance(caught.value, DataNotPreparedError)  # the CLI shows it as a missing-data message


def test_bad_kwargs_are_clear(tmp_path):
    with pytest.raises(ValueError, match="split"):
        gym.make("capo/ALFWorld-v0", data_dir=tmp_path, split="validation")
    with pytest.raises(ValueError, match="task_types"):
        gym.make("capo/ALFWorld-v0", data_dir=tmp_path, task_types=[7])


def test_without_prepared_data_the_card_is_not_ready_and_make_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPO_DATA_DIR", str(tmp_path))
    assert not capo_envs.CATALOG["capo/ALFWorld-v0"].data_ready()
    with pytest.raises(DataNotPreparedError, match="capo data prepare alfworld"):
        gym.make("capo/ALFWorld-v0")


# --- the real engine -------------------------------------------------------------------------------------
def real_env(**kwargs):
    return gym.make("capo/ALFWorld-v0", data_dir=REAL, split="train", **kwargs)


def play_expert(env) -> tuple[dict, list[str]]:
    base, commands, done = env.unwrapped, [], False
    while not done:
        action = base.expert_action()
        _, reward, terminated, truncated, info = env.step(action)
        assert info["action_valid"], info["invalid_reason"]
        commands.append(info["command"])
        done = terminated or truncated
    return info | {"last_reward": reward, "terminated": terminated}, commands


@pytest.mark.shared
@needs_engine
@needs_real_game
def test_expert_wins_the_real_game():
    env = real_env()
    obs, info = env.reset(seed=0)
    assert info["task_id"] == REAL_TRIAL and info["task_type"] == "pick_heat_then_place_in_recep"
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-") and "Your task is to: put a hot potato in sinkbasin." in obs
    assert "go to microwave 1" in info["available_actions"] and "help" in info["available_actions"]
    assert env.unwrapped.expert_action() == "<action>look</action>"  # ALFWorld's expert starts with look
    final, commands = play_expert(env)
    assert final["terminated"] and final["last_reward"] == 1.0 and final["metrics"]["success"] == 1.0
    assert commands[-1] == "move potato 1 to sinkbasin 1" and final["metrics"]["nonadmissible"] == 0.0
    env.close()


@pytest.mark.shared
@needs_engine
@needs_real_game
def test_real_game_contract_nonadmissible_malformed_tool_call_budget_and_close():
    env = real_env(max_steps=4, action_format="tool_call", win_reward=10.0)
    obs, info = env.reset(options={"task_id": REAL_TRIAL})
    assert env.unwrapped.expert_action() == '<tool_call>{"name": "env_step", "arguments": {"command": "look"}}</tool_call>'
    # Well-formed but not admissible: the engine answers, nothing changes, the step is invalid and counted.
    obs, reward, terminated, truncated, info = env.step('<tool_call>{"name": "env_step", "arguments": {"command": "Go  To Moon 1"}}</tool_call>')
    assert obs.startswith("Nothing happens.") and reward == 0.0 and not (terminated or truncated)
    assert not info["action_valid"] and "not an admissible command" in info["invalid_reason"]
    assert info["action"] == {"name": "", "args": {}} and info["command"] == "go to moon 1" and info["step"] == 1
    # Malformed: format feedback and the admissible commands.
    obs, _, _, _, info = env.step("<action>look</action>")
    assert obs.startswith("Invalid action:") and "Admissible commands: go to cabinet 1" in obs
    assert info["invalid_reason"] == "no <tool_call> found"
    obs, _, _, _, info = env.step('<tool_call>{"name": "env_step", "arguments": {"command": "GO TO microwave 1"}}</tool_call>')
    assert info["action_valid"] and obs.startswith("You arrive at microwave 1.")
    _, _, terminated, truncated, info = env.step("<tool_call>{}</tool_call>")
    assert truncated and not terminated and info["ended_by"] == "step_budget"
    assert info["metrics"] == {"success": 0.0, "nonadmissible": 1.0, "steps": 4.0, "invalid_actions": 3.0}
    pid = env.unwrapped.engine_pid
    env.close()
    assert env.unwrapped.engine_pid is None and not pid_alive(pid)


@pytest.mark.shared
@needs_engine
@needs_real_game
def test_an_engine_call_past_its_timeout_kills_the_process_and_truncates():
    env = real_env()
    env.reset(seed=0)
    base = env.unwrapped
    pid = base.engine_pid
    base._engine.call_timeout = 1e-4  # no real step answers this fast
    obs, _, terminated, truncated, info = env.step("<action>look</action>")
    assert truncated and not terminated and info["ended_by"] == "engine_error" and info["metrics"]["steps"] == 1.0
    assert "did not answer" in obs and not pid_alive(pid)
    base._engine.call_timeout = 60.0
    obs, info = env.reset(seed=0)  # a fresh process
    assert base.engine_pid != pid and obs.startswith("-= Welcome")
    env.close()


def pid_alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by a parent that died) counts as gone
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.shared
@needs_engine
@needs_real_game
def test_async_vector_env_plays_the_real_game_and_close_ends_every_engine():
    envs = gym.vector.AsyncVectorEnv([real_env for _ in range(2)], shared_memory=False)
    try:
        obs, infos = envs.reset(seed=[0, 1])
        assert all(o.startswith("-= Welcome") for o in obs)
        won = 0
        for _ in range(16):
            actions = [a or "" for a in envs.call("expert_action")]
            _, rewards, terminated, _, _ = envs.step(actions)
            won += int(terminated.sum())
        assert won == 2
        pids = envs.call("engine_pid")
        assert all(pid_alive(p) for p in pids)
    finally:
        envs.close()
    assert not any(pid_alive(p) for p in pids)


def test_real_data_folder_can_be_copied_to_a_prepared_layout(tmp_path, monkeypatch):
    """``data_dir`` defaults to ``$CAPO_DATA_DIR/alfworld`` once its manifest exists."""
    if not (REAL / "json_2.1.1").is_dir() or not engine_available():
        pytest.skip("needs ../shared/data/alfworld and the alfworld extra")
    target = tmp_path / "alfworld"
    shutil.copytree(REAL / "json_2.1.1", target / "json_2.1.1")
    (target / "manifest.json").write_text("{}")
    monkeypatch.setenv("CAPO_DATA_DIR", str(tmp_path))
    assert capo_envs.CATALOG["capo/ALFWorld-v0"].data_ready()
    env = gym.make("capo/ALFWorld-v0", split="train")
    assert env.unwrapped.task_ids() == (REAL_TRIAL,)
    env.close()


@needs_engine
def test_a_broken_game_is_an_engine_error_naming_the_failure(tmp_path):
    from capo_envs.alfworld.engine import EngineError

    broken = {"pddl_domain": "(define (domain alfred))", "grammar": "{}", "pddl_problem": "(oops", "solvable": True}
    write_trial(tmp_path, "train", "pick_and_place_simple-Apple-None-Fridge-1", "pick_and_place_simple", broken)
    env = gym.make("capo/ALFWorld-v0", data_dir=tmp_path)
    with pytest.raises(EngineError, match="the engine failed on 'load'"):
        env.reset(seed=0)
    env.close()
