"""Where an iteration's time goes: the time/* phases of every RL record add up to its time/iteration_s, and
``eval_every=0`` evaluates never, not even after a warm start."""

from __future__ import annotations

import json

import pytest

from capo_train import trainer
from capo_train.report import ITERATION_PHASES, PHASE_PARTS
from capo_train.trainer import train

from test_trainer import config_for


def records(out_dir) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]


def test_the_phases_add_up_to_the_iteration(tiny_model_dir, tmp_path, monkeypatch):
    """A warm start, a critic, a KL reference, a separate critic's update, recorded episodes and a
    held-out evaluation every iteration: every phase is timed, and nothing of the loop is left out."""
    ends = []  # when each record was written: the loop's own clock
    real_log = trainer.Logger.log

    def log(self, record):
        real_log(self, record)
        ends.append(trainer.time.perf_counter())

    monkeypatch.setattr(trainer.Logger, "log", log)
    train(config_for(tiny_model_dir, tmp_path, "iterations=3", "eval_every=1", "record_every=1",
                     "model.lora=false", "model.critic=separate"), progress=False)
    log_lines = records(tmp_path)
    assert [r["iteration"] for r in log_lines] == [0, 1, 2, 3]
    first = log_lines[0]
    assert {"time/sft_s", "time/eval_s", "time/checkpoint_s"} <= set(first) and "time/iteration_s" not in first
    for record in log_lines[1:]:
        phases = {k for k in ITERATION_PHASES if k in record}
        assert phases == set(ITERATION_PHASES) - {"time/old_logp_s", "time/weight_sync_s"}, record
        total = sum(record[k] for k in phases)
        assert total == pytest.approx(record["time/iteration_s"], rel=0.03, abs=0.01)
        for phase, parts in PHASE_PARTS.items():
            assert all(k in record for k in parts)
            assert sum(record[k] for k in parts) <= record[phase] + 1e-6
        assert record["time/update_critic_s"] + record["time/update_actor_s"] == pytest.approx(
            record["time/update_s"], rel=0.03, abs=0.01)
    # the sum of time/iteration_s is the loop's wall time from record 0 to the last record's checkpoint
    loop = ends[-1] - ends[0]
    assert sum(r["time/iteration_s"] for r in log_lines[1:]) == pytest.approx(loop, rel=0.03, abs=0.02)
    # the checkpoint's copy of the history holds the completed records: a resumed run logs the same
    state = json.loads((tmp_path / "checkpoint" / "run_state.json").read_text())
    assert state["history"] == log_lines


def test_recomputed_old_logprobs_are_timed(tiny_model_dir, tmp_path):
    train(config_for(tiny_model_dir, tmp_path, "algo=grpo", "iterations=1", "sft.episodes=0", "eval_every=0",
                     "model.lora=false", "rollout.recompute_logprobs=true"), progress=False)
    (record,) = records(tmp_path)
    assert record["time/old_logp_s"] > 0 and "time/values_s" not in record  # grpo: no critic
    assert "time/log_s" not in record  # no record before it
    assert sum(record[k] for k in ITERATION_PHASES if k in record) == pytest.approx(
        record["time/iteration_s"], rel=0.03, abs=0.01)


def test_eval_every_0_never_evaluates_even_after_a_warm_start(tiny_model_dir, tmp_path, monkeypatch):
    def no_evaluation(*args, **kwargs):
        raise AssertionError("eval_every=0 evaluated")

    monkeypatch.setattr(trainer, "held_out", no_evaluation)
    train(config_for(tiny_model_dir, tmp_path, "iterations=2", "eval_every=0", "sft.episodes=2"), progress=False)
    log_lines = records(tmp_path)
    assert [r["iteration"] for r in log_lines] == [0, 1, 2]
    assert "sft/episodes" in log_lines[0]  # the warm start is still logged as record 0
    assert not any(k.startswith("eval/") or k == "time/eval_s" for r in log_lines for k in r)
    assert not (tmp_path / "episodes" / "eval-000000.jsonl").exists()
