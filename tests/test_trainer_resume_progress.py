"""A run killed while checkpointing an iteration, or between checkpointing and logging it, resumes with a
clean log.jsonl (each iteration once, as an uninterrupted run logs it); and
``capo train`` with stdout in a pipe (``capo train > run.log``) prints flushed progress lines as it goes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from capo_train import trainer
from capo_train.trainer import train

from test_trainer import SMALL_RUN, config_for


def log_records(out_dir):
    return [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]


def without_timings(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(("time/", "throughput/"))}


@pytest.mark.slow
@pytest.mark.parametrize("where", ["saving", "logging"])
def test_a_kill_around_the_checkpoint_leaves_each_iteration_once(tiny_model_dir, tmp_path, monkeypatch, where):
    """``saving``: killed while iteration 2's checkpoint is written (the log holds 0 and 1); ``logging``:
    after it, before its record is logged (the checkpoint holds 2, the log does not yet)."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    train(config_for(tiny_model_dir, whole), progress=False)

    real_save, real_log = trainer.save_run, trainer.Logger.log

    def killed_while_saving(out_dir, model, tokenizer, optimizers, state, config):
        if state.iteration == 2:  # iteration 2's checkpoint is never written, nor its record logged
            raise KeyboardInterrupt
        return real_save(out_dir, model, tokenizer, optimizers, state, config)

    def killed_while_logging(self, record):
        if record["iteration"] == 2:  # its checkpoint is written
            raise KeyboardInterrupt
        return real_log(self, record)

    if where == "saving":
        monkeypatch.setattr(trainer, "save_run", killed_while_saving)
    else:
        monkeypatch.setattr(trainer.Logger, "log", killed_while_logging)
    with pytest.raises(KeyboardInterrupt):
        train(config_for(tiny_model_dir, killed), progress=False)
    assert [r["iteration"] for r in log_records(killed)] == [0, 1]  # what the kill leaves behind
    monkeypatch.setattr(trainer, "save_run", real_save)
    monkeypatch.setattr(trainer.Logger, "log", real_log)

    train(config_for(tiny_model_dir, killed), resume=True, progress=False)
    assert [r["iteration"] for r in log_records(killed)] == [0, 1, 2]
    assert [without_timings(r) for r in log_records(killed)] == [without_timings(r) for r in log_records(whole)]
    assert not list(killed.glob(".log.jsonl*"))


@pytest.mark.slow
def test_capo_train_into_a_pipe_prints_progress_lines_as_it_goes(tiny_model_dir, tmp_path):
    command = [sys.executable, "-m", "capo_train.cli", "train", f"model.path={tiny_model_dir}",
               f"out_dir={tmp_path}", *SMALL_RUN]
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    arrivals = []  # (seconds since start, line) as the pipe delivers them
    for line in process.stdout:
        arrivals.append((time.monotonic() - started, line.rstrip("\n")))
    stderr = process.stderr.read()
    assert process.wait(timeout=300) == 0, stderr
    ended = time.monotonic() - started
    lines = [line for _, line in arrivals if line.startswith("[capo train]")]
    expected = [
        "[capo train] capo on capo/SynthHop-v0, 2 iterations",
        "[capo train] warm start: behaviour-cloning 2 expert episodes",
        "[capo train] expert episodes 2/2",
        "[capo train] warm-start step",
        "[capo train] warm start done:",
        "[capo train] held-out evaluation: 2 episodes",
        "[capo train] held-out success",  # after the warm start
        "[capo train] iteration 1/2 success",
        "[capo train] held-out evaluation: 2 episodes",
        "[capo train] held-out success",  # eval_every=2
        "[capo train] iteration 2/2 success",
    ]
    seen = iter(lines)
    for prefix in expected:  # in this order, other lines in between allowed
        assert any(line.startswith(prefix) for line in seen), (prefix, lines)
    assert all("\r" not in line for _, line in arrivals)
    # Flushed as printed, not when the process exits: the first line came long before the run ended.
    first = next(t for t, line in arrivals if line.startswith("[capo train] warm start:"))
    assert ended - first > 1.0, arrivals
