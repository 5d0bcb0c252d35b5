"""``capo eval --reverify``: recorded episodes replayed in a fresh env, differences reported (capo_train/reverify.py)."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

from capo_train.cli import main
from capo_train.eval_panel import EvalRequest, run_eval
from capo_train.reverify import ReplayError, RecordingEnv, describe, read_replay, reverify
from test_eval_cli import scripted, tokenizer  # noqa: F401  (fixtures: a door-choosing policy, no model)


@pytest.fixture
def recorded(scripted, tmp_path):  # noqa: F811
    scripted["rule"] = "seeded"  # some doors right, some wrong: rewards of several values to replay
    run_eval(EvalRequest(policy="scripted", panel="synthchain-k4-test-64", repeats=2, seed=1, record=str(tmp_path)))
    return tmp_path


def test_an_unchanged_env_replays_every_episode_identically(recorded):
    report = reverify(recorded)
    assert report["episodes"] == 128 and report["differing_episodes"] == 0 and report["differences"] == []
    assert report["panel"] == "synthchain-k4-test-64" and report["panel_hash"].startswith("sha256:")
    header, episodes = read_replay(recorded)
    assert header["env_kwargs"] == {"split": "test", "k": 4}
    assert all(ep["reset_seed"] is not None and len(ep["steps"]) == 4 for ep in episodes)
    assert {ep["task_id"] for ep in episodes[:2]} == {"synthchain-0-test-0"}  # a task's repeats come together


def test_a_deliberately_changed_reward_is_caught(recorded, monkeypatch):
    from capo_envs.diagnostics.env import SynthChainEnv

    original = SynthChainEnv._final_reward
    monkeypatch.setattr(SynthChainEnv, "_final_reward", lambda self: original(self) + 0.25)
    report = reverify(recorded)
    assert report["differing_episodes"] == report["episodes"] == 128
    first = report["differences"][0]
    assert (first["step"], first["field"]) == (3, "reward")  # SynthChain pays at the last of its 4 steps
    assert first["replayed"] == pytest.approx(first["recorded"] + 0.25)
    assert "128 differ" in describe(report) and "reward" in describe(report)
    assert main(["eval", "--reverify", str(recorded)]) == 1  # the command fails when something differs


def test_a_changed_metric_or_observation_is_caught(recorded, monkeypatch):
    from capo_envs.diagnostics.env import SynthChainEnv

    original = SynthChainEnv._metrics
    monkeypatch.setattr(SynthChainEnv, "_metrics", lambda self: {**original(self), "success": 0.5})
    fields = {d["field"] for d in reverify(recorded)["differences"]}
    assert fields == {"metrics.success"}
    monkeypatch.undo()
    monkeypatch.setattr(SynthChainEnv, "_observe", lambda self: "a different cue")
    first = reverify(recorded)["differences"][0]
    assert first["field"] == "first observation" and first["replayed"] == "a different cue"


def test_an_edited_recording_is_caught(recorded):
    path = recorded / "replay.jsonl"
    lines = path.read_text().splitlines()
    episode = json.loads(lines[5])
    episode["steps"][1]["observation"] = "0" * 16
    lines[5] = json.dumps(episode)
    path.write_text("\n".join(lines) + "\n")
    report = reverify(recorded)
    assert report["differing_episodes"] == 1
    assert report["differences"][0]["field"] == "observation" and report["differences"][0]["step"] == 1


def test_actions_with_unicode_line_breaks_replay(tmp_path):
    """JSON keeps U+0085 and U+2028 raw (ensure_ascii=False); a reader that splits lines on them breaks the
    file (found on a random tiny model's recording)."""
    env = RecordingEnv(gym.make("capo/SynthChain-v0", k=2, split="test"))
    env.reset(seed=3, options={"task_id": "synthchain-0-test-1"})
    env.step("<go>left</go>\x85")
    env.step("a\u2028b\u2029c\x1c")
    env.close()
    from capo_train.reverify import write_replay

    write_replay(tmp_path / "replay.jsonl", {"env_id": "capo/SynthChain-v0", "env_kwargs": {"k": 2, "split": "test"}},
                 env.episodes)
    report = reverify(tmp_path)
    assert report["episodes"] == 1 and report["differing_episodes"] == 0


def test_the_recorder_sees_exactly_what_the_env_was_sent():
    env = RecordingEnv(gym.make("capo/SynthChain-v0", k=2, split="test"))
    env.reset(seed=3, options={"task_id": "synthchain-0-test-1"})
    env.step("<go>left</go>")
    env.step("not an action")
    (episode,) = env.episodes
    assert episode["reset_seed"] == 3 and [s["action"] for s in episode["steps"]] == ["<go>left</go>", "not an action"]
    assert [s["action_valid"] for s in episode["steps"]] == [True, False] and "metrics" in episode["steps"][-1]
    env.close()


@pytest.mark.parametrize(("content", "message"), [
    (None, "no replay.jsonl"),
    ("{not json\n", "is not a capo replay file"),
    ('{"kind": "capo-replay", "version": 1, "env_id": "capo/SynthChain-v0"}\n{cut off\n', "is damaged: line 2"),
    ('{"kind": "something else"}\n', "is not a capo replay file"),
    ('{"kind": "capo-replay", "version": 99}\n', "replay version 99"),
    ('{"kind": "capo-replay", "version": 1, "env_id": "capo/SynthChain-v0"}\n{"steps": 3}\n', "lacks task_id"),
])
def test_bad_replay_files_are_one_clear_sentence(tmp_path, content, message):
    if content is not None:
        (tmp_path / "replay.jsonl").write_text(content)
    with pytest.raises(ReplayError, match=message):
        read_replay(tmp_path)
    with pytest.raises(SystemExit, match=message):
        main(["eval", "--reverify", str(tmp_path)])


def test_a_file_that_is_no_replay_is_named_as_such(tmp_path):
    (tmp_path / "notes.md").write_text("# Learning, shown\n")
    with pytest.raises(ReplayError, match="notes.md is not a capo replay file"):
        read_replay(tmp_path / "notes.md")


def test_a_training_runs_viewing_files_are_explained_not_replayed(tmp_path):
    (tmp_path / "episodes").mkdir()
    (tmp_path / "episodes" / "iter-000001.jsonl").write_text("{}\n")
    with pytest.raises(ReplayError, match="for viewing"):
        read_replay(tmp_path)


def test_an_env_that_cannot_be_made_again_is_reported(recorded):
    path = recorded / "replay.jsonl"
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["env_kwargs"] = {**header["env_kwargs"], "k": 99}
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(ReplayError, match="cannot make 'capo/SynthChain-v0' with the recorded kwargs"):
        reverify(recorded)
