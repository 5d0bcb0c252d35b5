"""The training loop end to end on SynthHop with a tiny model built from a config (no downloads)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from capo_train.algorithms import ALGORITHMS
from capo_train.config import load_config
from capo_train.models import CHECKPOINT, load_checkpoint
from capo_train.trainer import train

SMALL_RUN = [
    "iterations=2",
    "env.id=capo/SynthHop-v0",
    "env.kwargs={size: tiny, k: 1, max_passage_chars: 40}",
    "rollout.tasks_per_batch=2",
    "rollout.group_size=2",
    "rollout.max_action_tokens=8",
    "rollout.max_prompt_tokens=2000",
    "optim.minibatch_rows=2",
    "eval_every=2",
    "eval_episodes=2",
    "sft.episodes=2",
    "log_tensorboard=false",
    "algo_overrides={kl_coef: 0.001}",  # the CPU default turns KL off; the tests keep the reference path covered
]


def config_for(model_dir, out_dir, *extra):
    return load_config(None, [f"model.path={model_dir}", f"out_dir={out_dir}", *SMALL_RUN, *extra])


def weights(out_dir):
    model, _ = load_checkpoint(out_dir / CHECKPOINT)
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_every_algorithm_runs_two_iterations(tiny_model_dir, tmp_path, algo):
    extra = [f"algo={algo}", "model.lora=false", "sft.episodes=0", "eval_every=0"]
    summary = train(config_for(tiny_model_dir, tmp_path, *extra), progress=False)
    assert summary["iterations"] == 2
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [1, 2]
    for record in records:
        assert math.isfinite(record["actor/loss"]), record
        assert record["rollout/episodes"] == 4.0
        if ALGORITHMS[algo].needs_critic:
            assert math.isfinite(record["critic/loss"])
        if not ALGORITHMS[algo].defaults.get("kl_in_reward"):  # KL as a loss term against the reference
            assert math.isfinite(record["actor/kl_ref"])
        assert record["actor/approx_kl"] >= 0 and math.isfinite(record["actor/old_approx_kl"])  # CleanRL's pair
        assert "actor/skipped_updates" not in record


@pytest.mark.parametrize("algo", ["capo", "ppo"])
def test_target_kl_stops_the_actor_once_a_mini_batch_has_moved_too_far(tiny_model_dir, tmp_path, algo):
    """With a huge lr the first step carries the policy far: optim.target_kl stops the next mini-batch's step
    (its approx_kl, measured before the step, is over the target); a target nothing reaches stops nothing."""
    common = [f"algo={algo}", "iterations=1", "model.lora=false", "sft.episodes=0", "eval_every=0",
              "optim.minibatch_rows=1", "optim.actor_lr=0.5"]

    def record(target_kl: float) -> dict:
        out = tmp_path / str(target_kl)
        train(config_for(tiny_model_dir, out, *common, f"optim.target_kl={target_kl}"), progress=False)
        return json.loads((out / "log.jsonl").read_text().splitlines()[0])

    stopped, unstopped = record(0.01), record(1e9)
    assert unstopped["actor/stopped_early"] == 0 and unstopped["actor/steps"] >= 3  # one step a row
    assert stopped["actor/stopped_early"] == 1 and 1 <= stopped["actor/steps"] < unstopped["actor/steps"]
    assert stopped["actor/approx_kl_at_stop"] > 0.01
    assert stopped["actor/approx_kl"] <= 0.01  # the mean over the mini-batches stepped on, all under it


@pytest.mark.parametrize("algo", ["capo", "ppo"])
def test_update_scores_actions_at_the_rollout_temperature(tiny_model_dir, tmp_path, algo):
    """Sampled at T=0.5, scored at T=0.5: before any update (one mini-batch) every ratio is 1."""
    extra = [f"algo={algo}", "iterations=1", "model.lora=false", "sft.episodes=0", "eval_every=0",
             "rollout.temperature=0.5", "optim.minibatch_rows=64"]
    train(config_for(tiny_model_dir, tmp_path, *extra), progress=False)
    record = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])
    assert record["actor/ratio_min"] == pytest.approx(1.0, abs=1e-3)
    assert record["actor/ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert abs(record["actor/approx_kl"]) < 1e-5 and abs(record["actor/old_approx_kl"]) < 1e-5


def test_warm_start_then_rl_with_lora_writes_curve_and_summary(tiny_model_dir, tmp_path):
    with pytest.warns(UserWarning, match="longer than rollout.max_action_tokens=8"):  # SMALL_RUN cuts answers
        summary = train(config_for(tiny_model_dir, tmp_path, "sft.epochs=4"), progress=False)
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert records[0]["iteration"] == 0 and records[0]["sft/expert_success"] == 1.0
    assert records[0]["sft/actions_over_limit"] > 0 and records[0]["sft/action_tokens_max"] > 8
    assert records[0]["sft/loss_last"] < records[0]["sft/loss_first"]
    assert "eval/success" in records[0] and "eval/success" in records[-1]
    assert summary["eval_success_after_warm_start"] is not None
    assert (tmp_path / "learning_curve.png").stat().st_size > 1000
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert not list(tmp_path.glob(".checkpoint*"))  # no temp or old checkpoint left behind


def test_sft_tasks_are_cloned_and_held_out_of_rl(tiny_model_dir, tmp_path):
    from capo_train.models import load_actor
    from capo_train.sft import expert_trajectories, warm_start_tasks
    from capo_train.setup import make_envs

    config = config_for(tiny_model_dir, tmp_path, "sft.tasks=5")
    env = make_envs(config, "train", 1)[0]
    every = [str(i) for i in env.unwrapped.task_ids()]
    warm, rl = warm_start_tasks(config, env)
    assert warm == every[:5] and rl == every[5:]
    assert warm_start_tasks(config_for(tiny_model_dir, tmp_path), env) == (None, None)  # the default
    _, tokenizer = load_actor(tiny_model_dir)
    cloned = expert_trajectories(env, tokenizer, episodes=12, task_pool=warm, seed=3)
    assert {t.task_id for t in cloned} == set(warm)  # more episodes than tasks: every one, none outside
    too_many = config_for(tiny_model_dir, tmp_path, f"sft.tasks={len(every)}")
    with pytest.raises(ValueError, match="leaves no task for RL"):
        train(too_many, progress=False)


def test_resumed_run_matches_an_uninterrupted_one(tiny_model_dir, tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    train(config_for(tiny_model_dir, whole), progress=False)
    train(config_for(tiny_model_dir, halves, "iterations=1"), progress=False)
    train(config_for(tiny_model_dir, halves), resume=True, progress=False)
    a, b = weights(whole), weights(halves)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)
    log = lambda d: [json.loads(x) for x in (d / "log.jsonl").read_text().splitlines()]  # noqa: E731
    # Timings differ, and the interrupted run also evaluated at its (then) last iteration.
    comparable = lambda r: {k: v for k, v in r.items() if not k.startswith(("time/", "throughput/", "eval/"))}  # noqa: E731
    assert [comparable(r) for r in log(whole)] == [comparable(r) for r in log(halves)]


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_critic_warmup_trains_the_critic_and_leaves_the_actor(tiny_model_dir, tmp_path, critic):
    """optim.critic_warmup=1: iteration 1 steps the critic only (the actor's weights are those it started
    from), iteration 2 steps both."""
    config = config_for(tiny_model_dir, tmp_path, "iterations=1", "sft.episodes=0", "eval_every=0",
                        "model.lora=false", f"model.critic={critic}", "optim.critic_warmup=1")
    train(config, progress=False)
    start = load_checkpoint_free_weights(tiny_model_dir)
    warmed = weights(tmp_path)
    for key, value in start.items():
        torch.testing.assert_close(warmed[f"actor.{key}"], value, rtol=0, atol=0, msg=key)
    first = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])
    assert math.isfinite(first["critic/loss"]) and first["critic/grad_norm"] > 0
    assert "actor/loss" not in first
    config = config_for(tiny_model_dir, tmp_path, "iterations=2", "sft.episodes=0", "eval_every=0",
                        "model.lora=false", f"model.critic={critic}", "optim.critic_warmup=1")
    train(config, resume=True, progress=False)
    second = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[1])
    assert math.isfinite(second["actor/loss"]) and math.isfinite(second["critic/loss"])
    stepped = weights(tmp_path)
    assert any(not torch.equal(stepped[f"actor.{key}"], value) for key, value in start.items())


def test_critic_warmup_is_ignored_by_a_critic_free_algorithm(tiny_model_dir, tmp_path):
    config = config_for(tiny_model_dir, tmp_path, "algo=grpo", "iterations=1", "sft.episodes=0", "eval_every=0",
                        "model.lora=false", "optim.critic_warmup=1")
    train(config, progress=False)
    record = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[0])
    assert math.isfinite(record["actor/loss"]) and record["actor/grad_norm"] > 0


def test_nan_loss_skips_the_update_and_keeps_the_weights(tiny_model_dir, tmp_path, monkeypatch):
    import dataclasses

    nan_loss = lambda *a, **k: (torch.tensor(float("nan"), requires_grad=True), {})  # noqa: E731
    broken = dataclasses.replace(ALGORITHMS["capo"], policy_loss=nan_loss)
    monkeypatch.setitem(ALGORITHMS, "capo", broken)
    config = config_for(tiny_model_dir, tmp_path, "iterations=1", "sft.episodes=0", "eval_every=0", "model.lora=false")
    before = {k: v.clone() for k, v in load_checkpoint_free_weights(tiny_model_dir).items()}
    with pytest.warns(RuntimeWarning, match="update skipped"):
        train(config, progress=False)
    after = weights(tmp_path)
    for key, value in before.items():
        torch.testing.assert_close(after[f"actor.{key}"], value, rtol=0, atol=0, msg=key)
    record = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[-1])
    assert record["actor/skipped_updates"] >= 1


def load_checkpoint_free_weights(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).state_dict()


def test_cli_train_rejects_bad_keys(capsys):
    from capo_train.cli import main

    with pytest.raises(SystemExit, match="unknown config key 'rollout.nope'"):
        main(["train", "rollout.nope=3"])


@pytest.mark.parametrize("lora", [False, True])
def test_kl_reference_after_a_warm_start_is_the_warm_started_policy(tiny_model_dir, tmp_path, lora):
    """With KL on, the first RL iteration's KL to the reference is ~0: the reference is the actor the warm
    start produced (frozen in run/warm_start), not the checkpoint from before it (whose KL was large)."""
    config = config_for(tiny_model_dir, tmp_path, f"model.lora={str(lora).lower()}", "iterations=1", "sft.episodes=8",
                        "sft.epochs=4", "eval_every=0", "optim.minibatch_rows=64")
    train(config, progress=False)
    record = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()][-1]
    assert record["iteration"] == 1
    assert abs(record["actor/kl_ref"]) < 1e-4, record["actor/kl_ref"]
    assert (tmp_path / "warm_start" / "config.json").is_file()


def test_a_fresh_run_ignores_a_warm_start_left_by_an_earlier_run(tiny_model_dir, tmp_path):
    """Only a resumed run takes its KL reference from run/warm_start: a new run in the same folder (no warm
    start of its own) anchors to its starting model, so its first KL is ~0."""
    common = ["model.lora=false", "iterations=1", "eval_every=0", "optim.minibatch_rows=64"]
    train(config_for(tiny_model_dir, tmp_path, *common, "sft.episodes=8", "sft.epochs=4"), progress=False)
    assert (tmp_path / "warm_start").is_dir()
    train(config_for(tiny_model_dir, tmp_path, *common, "sft.episodes=0"), progress=False)
    record = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()][-1]
    assert abs(record["actor/kl_ref"]) < 1e-4, record["actor/kl_ref"]
