"""``capo compare`` end to end: a real 2 algorithms x 2 seeds grid with a tiny model built from a config."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
import statistics
import threading
from pathlib import Path

import pytest
import yaml

from capo_train.compare import GridConfig, cell_config, cell_dir, describe, drain, grid_envs, load_grid, run_grid
from capo_train.compare_report import columns, markdown_table, run_metrics, summarise_seeds
from capo_train.report import read_log
from capo_train.cli import main
from capo_train.config import ConfigError, TrainConfig

# Two steps per episode keep the tiny tokenizer's prompts short (and the cells fast).
ENV = {"id": "capo/SynthHop-v0", "kwargs": {"size": "tiny", "k": 1, "max_passage_chars": 40, "max_steps": 2},
       "name": "synth-tiny"}
ALGOS, SEEDS, TRAJECTORIES = ["capo", "grpo"], [0, 1], 4
BASE = {  # the smallest budgets that still run every stage of a cell, end-of-run evaluation included
    "model": {"lora": False},
    "sft": {"episodes": 0},
    "eval_episodes": 2,
    "log_tensorboard": False,
    "rollout": {"max_action_tokens": 8},
    "optim": {"minibatch_rows": 4},
}


@pytest.fixture(scope="module")
def grid_run(tiny_model_dir, tmp_path_factory):
    """The grid run once through the CLI (YAML + flags + base.key=value overrides); tests read its files."""
    root = tmp_path_factory.mktemp("compare")
    grid_yaml = root / "grid.yaml"
    grid_yaml.write_text(yaml.safe_dump(
        {"envs": [ENV], "iterations": 1, "episodes_per_batch": TRAJECTORIES, "group_size": 2, "base": BASE}
    ))
    out = root / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        main(["compare", "--grid", str(grid_yaml), "--algos", ",".join(ALGOS), "--seeds", "0,1", "--out", str(out),
              f"base.model.path={tiny_model_dir}"])
    grid = load_grid(grid_yaml, [f"base.model.path={tiny_model_dir}", "algos=capo,grpo", "seeds=0,1", f"out_dir={out}"])
    return grid, out, stdout.getvalue()


def logs(grid, algo):
    env = grid_envs(grid)[0]
    return {seed: read_log(cell_dir(grid, env, algo, seed) / "log.jsonl") for seed in grid.seeds}


def test_every_cell_is_trained_and_every_result_file_written(grid_run):
    grid, out, stdout = grid_run
    for algo in ALGOS:
        for seed in SEEDS:
            summary = json.loads((out / "runs" / "synth-tiny" / algo / f"seed-{seed}" / "summary.json").read_text())
            assert summary["algo"] == algo and summary["iterations"] == 1
    assert (out / "curves.png").stat().st_size > 1000
    assert json.loads((out / "grid.json").read_text())["algos"] == ALGOS
    md = (out / "results.md").read_text()
    assert md.startswith("Grid: `capo compare --grid") and "base.model.path=" in md.splitlines()[0]
    table = markdown_table(run_grid(grid), grid)  # everything done: only re-aggregates
    assert table in md and table in stdout and f"in {out}" in stdout
    assert "| synth-tiny | grpo | 2/2 |" in table and " ± " in table


def test_csv_means_and_stds_match_the_per_run_summaries_and_logs(grid_run):
    grid, out, _ = grid_run
    rows = {r["algo"]: r for r in csv.DictReader((out / "results.csv").read_text().splitlines())}
    assert set(rows) == set(ALGOS)
    for algo in ALGOS:
        row, runs = rows[algo], logs(grid, algo)
        dirs = [cell_dir(grid, grid_envs(grid)[0], algo, seed) for seed in SEEDS]
        summaries = [json.loads((d / "summary.json").read_text()) for d in dirs]
        by_hand = {
            "success": [s["eval_success_final"] for s in summaries],
            "seconds_per_iteration": [s["seconds_per_iteration"] for s in summaries],
            "trajectories": [sum(r["rollout/episodes"] for r in runs[s] if r["iteration"] >= 1) for s in SEEDS],
            "env_em": [runs[s][-1]["eval/env_em"] for s in SEEDS],
            "env_f1": [runs[s][-1]["eval/env_f1"] for s in SEEDS],
        }
        assert row["seeds_done"] == "2" and row["env"] == "synth-tiny"
        for name, values in by_hand.items():
            assert float(row[f"{name}_mean"]) == pytest.approx(statistics.fmean(values)), (algo, name)
            assert float(row[f"{name}_std"]) == pytest.approx(statistics.stdev(values), abs=1e-12), (algo, name)


def test_group_methods_get_the_same_episodes_per_batch(grid_run):
    grid, _, _ = grid_run
    env = grid_envs(grid)[0]
    rollouts = {a: cell_config(grid, env, a, 0).rollout for a in ALGOS}
    shapes = {a: (r.tasks_per_batch, r.group_size) for a, r in rollouts.items()}
    assert shapes == {"capo": (4, 1), "grpo": (2, 2)}
    for algo in ALGOS:
        for records in logs(grid, algo).values():
            rl = [r for r in records if r["iteration"] >= 1]
            assert [r["rollout/episodes"] for r in rl] == [TRAJECTORIES] * grid.iterations, algo
            assert "eval/success" in rl[-1]  # evaluated at the end of the cell


def test_a_second_run_skips_finished_cells_and_redoes_only_a_missing_one(grid_run, tmp_path):
    grid, out, _ = grid_run
    moved = tmp_path / "moved"  # a grid folder can move: the cells are found relative to it
    shutil.copytree(out, moved)
    grid.out_dir = str(moved)
    env = grid_envs(grid)[0]
    redo = cell_dir(grid, env, "grpo", 1)
    (redo / "summary.json").unlink()
    others = [cell_dir(grid, env, a, s) for a, s in (("capo", 0), ("capo", 1), ("grpo", 0))]
    before = {p: p.stat().st_mtime_ns for d in others for p in d.rglob("*") if p.is_file()}
    redo_log = (redo / "log.jsonl").read_text()
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        run_grid(grid)
    assert stdout.getvalue().count("done, skipped") == 3 and "grpo/seed-1: training" in stdout.getvalue()
    assert {p: p.stat().st_mtime_ns for d in others for p in d.rglob("*") if p.is_file()} == before
    # It resumes from its final checkpoint: the summary comes back and no iteration is run again.
    assert (redo / "summary.json").exists() and (redo / "log.jsonl").read_text() == redo_log


def test_parallel_jobs_train_the_missing_cells_like_a_serial_run(grid_run, tmp_path):
    grid, out, _ = grid_run
    parallel = tmp_path / "parallel"
    shutil.copytree(out, parallel)
    grid.out_dir = str(parallel)
    env = grid_envs(grid)[0]
    redo = [("capo", 0), ("grpo", 1)]
    for algo, seed in redo:
        shutil.rmtree(cell_dir(grid, env, algo, seed))
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rows = run_grid(grid, jobs=2)
    assert stdout.getvalue().count("done, skipped") == 2 and stdout.getvalue().count(": finished") == 2
    assert all(r["seeds_done"] == 2 for r in rows)
    grid.out_dir = str(out)
    for algo, seed in redo:  # the same seeds give the same episodes, whichever process trained them
        serial = read_log(cell_dir(grid, env, algo, seed) / "log.jsonl")
        again = read_log(Path(parallel) / "runs" / "synth-tiny" / algo / f"seed-{seed}" / "log.jsonl")
        assert len(serial) == len(again)
        assert [r["iteration"] for r in serial] == [0, 1]  # held-out before RL (no warm start), then RL
        assert serial[0]["eval/success"] == again[0]["eval/success"]
        for a, b in zip(serial[1:], again[1:]):
            for key in ("rollout/episodes", "rollout/success", "rollout/tokens_generated", "eval/success"):
                assert a[key] == b[key], (algo, seed, key)
            assert b["actor/entropy"] == pytest.approx(a["actor/entropy"], rel=1e-4)  # thread-count rounding only


def test_parallel_cells_are_reported_as_each_finishes_not_when_all_have():
    """A fast cell's results are written while a slow one still trains, and a failure still stops the grid."""
    from concurrent.futures import ThreadPoolExecutor

    slow_may_end = threading.Event()
    reports = []
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(slow_may_end.wait, 30)
        fast = pool.submit(lambda: None)

        def after_each():  # the first report comes while the slow cell is still running
            reports.append(slow.done())
            slow_may_end.set()

        with contextlib.redirect_stdout(io.StringIO()) as stdout:
            drain({slow: "slow", fast: "fast"}, after_each)
    assert reports[0] is False and stdout.getvalue().splitlines()[0] == "fast: finished"
    assert stdout.getvalue().count(": finished") == 2

    def fail():
        raise RuntimeError("cell failed")

    with ThreadPoolExecutor(1) as pool, pytest.raises(RuntimeError, match="cell failed"):
        drain({pool.submit(fail): "bad"}, lambda: None)


def test_a_finished_grid_rerun_with_other_settings_is_refused(grid_run):
    _, out, _ = grid_run
    changed = load_grid(out / "grid.json", ["base.optim.actor_lr=3e-4"])
    before = (out / "grid.json").read_text()
    was = 0.001  # optim.actor_lr is auto (null): the cells recorded the value used, a tiny model's full fine-tune
    with pytest.raises(ConfigError, match=rf"started with other settings \(optim.actor_lr: {was} -> 0.0003\)"):
        run_grid(changed)
    assert (out / "grid.json").read_text() == before  # refused before anything was written


def test_a_grid_resumes_under_another_env_pool(grid_run):
    """The env pool changes how env steps are scheduled, never the trajectories: a grid started under
    one pool (the default was serial before it was thread) is not refused under another."""
    _, out, _ = grid_run
    grid = load_grid(out / "grid.json", ["base.rollout.env_pool=process", "base.rollout.env_workers=2"])
    rows = run_grid(grid)  # every cell is done: nothing trains, nothing is refused
    assert rows and all(r["seeds_done"] >= 1 for r in rows)


def test_aggregation_of_hand_written_records(tmp_path):
    log = tmp_path / "log.jsonl"
    records = [
        {"iteration": 0, "eval/success": 1.0, "eval/env_em": 1.0},  # the warm start: not the final evaluation
        {"iteration": 1, "rollout/episodes": 4.0, "rollout/success": 0.0, "time/iteration_s": 9.0},
        {"iteration": 1, "rollout/episodes": 4.0, "rollout/success": 0.0, "time/iteration_s": 2.0,  # resumed
         "rollout/tokens_generated": 40.0},
        {"iteration": 2, "rollout/episodes": 4.0, "time/iteration_s": 4.0, "eval/success": 0.5, "eval/env_em": 0.5,
         "rollout/tokens_generated": 60.0, "eval/episodes": 2.0, "eval/tokens_generated": 30.0,
         "eval/invalid_action_rate": 0.25, "eval/actions_per_episode": 3.0, "eval/env_score": 0.75},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    first = run_metrics(read_log(log))
    assert first == {"trajectories": 8.0, "rl_tokens": 100.0, "seconds_per_iteration": 3.0, "success": 0.5,
                     "env_em": 0.5, "invalid_rate": 0.25, "actions": 3.0, "tokens": 15.0, "train_success": 0.0,
                     "env_score": 0.75}
    second = run_metrics([{"iteration": 1, "rollout/episodes": 4.0, "eval/success": 0.0}])  # no EM, no timing
    row = summarise_seeds([first, second])
    assert row["seeds_done"] == 2
    assert row["success_mean"] == 0.25 and row["success_std"] == pytest.approx(statistics.stdev([0.5, 0.0]))
    assert row["env_em_mean"] == 0.5 and row["env_em_std"] is None  # one seed reports it: no std
    assert row["trajectories_mean"] == 6.0 and row["trajectories_std"] == pytest.approx(statistics.stdev([8, 4]))
    assert "env_f1_mean" not in row
    assert summarise_seeds([]) == {"seeds_done": 0}
    rows = [{"env": "e", "algo": "a", "group_size": 1} | row]
    assert "env_f1_mean" not in columns(rows) and "env_em_mean" in columns(rows)
    assert row["env_score_mean"] == 0.75 and "env_score_mean" in columns(rows)  # WebShop's score, where reported
    grid = GridConfig(algos=["a"], seeds=[0, 1])
    table = markdown_table(rows, grid)
    assert "| held-out success | score | EM | invalid actions | actions / episode | tokens / episode | rollout" in table
    assert "| e | a | 2/2 | 0.250 ± 0.354 | 0.750 | 0.500 | 0.250 | 3.00 | 15.0 | 0.000 | 6 ± 3 | 50 ± 71 | 3.00 |" in table
    rollouts = [{"iteration": i, "rollout/episodes": 4.0, "rollout/success": i / 20} for i in range(1, 21)]
    assert run_metrics(rollouts)["train_success"] == pytest.approx((19 / 20 + 20 / 20) / 2)  # the last 2 of 20


def test_moving_average_of_a_curve():
    from capo_train.compare_report import moving_average

    points = [(4.0, 0.0), (8.0, 1.0), (12.0, 0.5), (16.0, 0.0)]
    assert moving_average(points, 2) == [(4.0, 0.0), (8.0, 0.5), (12.0, 0.75), (16.0, 0.25)]
    assert moving_average(points, 1) == points


def test_grid_yaml_overrides_merge_and_cells_get_their_shapes(tmp_path):
    path = tmp_path / "g.yaml"
    base = {"model": {"path": "m"}, "optim": {"actor_lr": 1e-5}}
    path.write_text(yaml.safe_dump({"algos": ["capo", "rloo"], "base": base}))
    grid = load_grid(path, ["base.optim.critic_lr=2e-3", "seeds=3", "envs=capo/SynthHop-v0", "iterations=5"])
    assert grid.base == {"model": {"path": "m"}, "optim": {"actor_lr": 1e-5, "critic_lr": 2e-3}}
    assert grid.seeds == [3] and grid.envs == ["capo/SynthHop-v0"]
    config = cell_config(grid, grid_envs(grid)[0], "rloo", 3)
    assert (config.rollout.tasks_per_batch, config.rollout.group_size) == (2, 4)
    assert config.eval_every == 5 and config.optim.actor_lr == 1e-5 and config.model.path == "m"
    assert config.env.kwargs == TrainConfig().env.kwargs  # an id alone: the default kwargs
    assert config.out_dir.endswith("runs/capo_SynthHop-v0/rloo/seed-3")
    assert GridConfig().algos[:2] == ["capo", "ppo"] and len(GridConfig().algos) >= 8  # default: every algorithm


def test_per_algo_settings_reach_only_that_algorithms_cells(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({
        "algos": ["capo", "grpo"], "envs": ["capo/SynthHop-v0"], "iterations": 4,
        "base": {"algo_overrides": {"bootstrap_truncated": False}},
        "per_algo": {"capo": {"algo_overrides": {"clip_low": "1e-3", "clip_high": 1e-3}}, "ppo": {"eval_every": 2}},
    }))
    grid = load_grid(path, ["per_algo.grpo.optim.actor_lr=2e-4"])
    env = grid_envs(grid)[0]
    capo, grpo = cell_config(grid, env, "capo", 0), cell_config(grid, env, "grpo", 0)
    assert capo.algo_overrides["clip_low"] == capo.algo_overrides["clip_high"] == 1e-3  # "1e-3" typed as a float
    assert capo.algo_overrides["bootstrap_truncated"] is False  # base's algo_overrides kept, key by key
    assert "clip_low" not in grpo.algo_overrides and grpo.algo_overrides["bootstrap_truncated"] is False
    assert grpo.optim.actor_lr == 2e-4 and capo.optim.actor_lr == TrainConfig().optim.actor_lr
    assert "- capo only: " in describe(grid, None) and '"clip_low": 0.001' in describe(grid, None)


@pytest.mark.parametrize("overrides, message", [
    (["algos=capo,nope"], "unknown algorithm 'nope'"),
    (["per_algo.nope.seed=1"], "per_algo.nope: unknown algorithm"),
    (["per_algo.capo.seed=1"], "per_algo.capo.seed is set by the grid"),
    (["per_algo.capo.optim.lr=1"], "unknown config key 'per_algo.capo.optim.lr'"),
    (["envs=capo/SynthHopp-v0"], "unknown env 'capo/SynthHopp-v0'; did you mean 'capo/SynthHop-v0'"),
    (["iteratons=3"], "did you mean 'iterations'"),
    (["base.optim.lr=1"], "unknown config key 'base.optim.lr'"),
    (["base.seed=3"], "base.seed is set by the grid; use the grid key 'seeds'"),
    (["episodes_per_batch=6"], "multiple of group_size"),
    (["trajectories_per_iteration=8"], "'trajectories_per_iteration' was renamed; did you mean 'episodes_per_batch'"),
    (["base.rollout.episodes_per_batch=8"], "use the grid key 'episodes_per_batch'"),
    (["seeds=a,b"], "seeds expects integers"),
    (["envs=[{id: capo/SynthHop-v0}, {id: capo/SynthHop-v0}]"], "distinct `name`s"),
])
def test_clear_errors_before_any_training(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_grid(None, overrides)


def test_cli_compare_rejects_an_unknown_algorithm():
    with pytest.raises(SystemExit, match="capo: unknown algorithm 'nope'"):
        main(["compare", "--algos", "capo,nope"])


def test_the_old_grid_key_in_a_yaml_file_names_the_new_one(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("trajectories_per_iteration: 8\n")
    with pytest.raises(ConfigError, match="did you mean 'episodes_per_batch'"):
        load_grid(path)


def test_capo_bench_says_it_was_renamed(capsys):
    assert main(["bench", "--algos", "capo"]) == 2
    assert "renamed: use `capo compare`" in capsys.readouterr().err


def test_held_out_curve_starts_at_the_warm_start_evaluation():
    """The held-out curve of a run evaluated before and after RL (eval_every = iterations, as the domain grids
    run) is two points, the warm start's at x = 0; the training curve never gets an iteration-0 point."""
    from capo_train.compare_report import learning_curve

    records = [{"iteration": 0, "eval/success": 0.02},
               *({"iteration": i, "rollout/episodes": 16.0, "rollout/success": 0.1 * i} for i in (1, 2)),
               {"iteration": 2, "eval/success": 0.40}]
    assert learning_curve(records, "eval/success") == [(0.0, 0.02), (32.0, 0.40)]
    assert learning_curve(records) == [(16.0, 0.1), (32.0, 0.2)]


def test_a_shared_warm_start_is_cloned_and_evaluated_once_a_seed_and_every_algorithm_starts_from_it(
        tiny_model_dir, tmp_path):
    """shared_warm_start: <out>/warm_starts/<env>/seed-N is trained once (iterations=0), and each algorithm's
    cell of that seed loads its actor and reports its iteration-0 record (the clone's figures and its
    held-out evaluation) instead of cloning and evaluating again."""
    base = BASE | {"sft": {"episodes": 2, "epochs": 1}}
    grid = load_grid(None, [f"out_dir={tmp_path}", "algos=capo,grpo", "seeds=0", "iterations=1", "group_size=2",
                            f"episodes_per_batch={TRAJECTORIES}", "shared_warm_start=true"],
                     {"envs": [ENV], "base": base | {"model": {"lora": False, "path": str(tiny_model_dir)}}})
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rows = run_grid(grid)
    assert "warm start synth-tiny/seed-0: training" in stdout.getvalue()
    assert all(r["seeds_done"] == 1 for r in rows)
    shared = read_log(tmp_path / "warm_starts" / "synth-tiny" / "seed-0" / "log.jsonl")
    assert [r["iteration"] for r in shared] == [0] and shared[0]["sft/episodes"] == 2
    for algo in ("capo", "grpo"):
        first = read_log(cell_dir(grid, grid_envs(grid)[0], algo, 0) / "log.jsonl")[0]
        assert first["sft/shared"] == 1.0
        for key in ("sft/loss_first", "sft/loss_last", "eval/success", "eval/episodes", "time/eval_s"):
            assert first[key] == shared[0][key], (algo, key)
    with contextlib.redirect_stdout(io.StringIO()) as again:
        run_grid(grid)  # finished: neither the warm start nor a cell is trained again
    assert "warm start" not in again.getvalue() and again.getvalue().count("done, skipped") == 2


def test_sft_from_run_loads_the_warm_starts_actor_and_refuses_a_run_past_it(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    from capo_train.config import load_config
    from capo_train.trainer import train

    def config(out, *extra, iterations=0):  # 0: what `capo sft` runs (the config file itself asks for >= 1)
        loaded = load_config(None, [f"model.path={tiny_model_dir}", "model.lora=false", f"env.id={ENV['id']}",
                                    f"env.kwargs={json.dumps(ENV['kwargs'])}", "eval_episodes=2",
                                    "log_tensorboard=false", "rollout.max_action_tokens=8", "sft.epochs=1",
                                    f"out_dir={out}", *extra])
        loaded.iterations = iterations
        return loaded

    def actor_weights(run):
        return load_file(next((run / "checkpoint" / "actor").glob("*.safetensors")))

    train(config(tmp_path / "sft", "sft.episodes=2"), progress=False)
    train(config(tmp_path / "from", f"sft.from_run={tmp_path / 'sft'}"), progress=False)
    shared, loaded = actor_weights(tmp_path / "sft"), actor_weights(tmp_path / "from")
    assert shared.keys() == loaded.keys() and all((shared[k] == loaded[k]).all() for k in shared)
    # evaluated on other settings: the shared warm start's figure does not stand for this run's
    train(config(tmp_path / "more", f"sft.from_run={tmp_path / 'sft'}", "eval_episodes=3"), progress=False)
    assert read_log(tmp_path / "more" / "log.jsonl")[0]["eval/episodes"] == 3
    train(config(tmp_path / "rl", "sft.episodes=2", "rollout.episodes_per_batch=2", iterations=1), progress=False)
    with pytest.raises(ValueError, match="not a warm start"):
        train(config(tmp_path / "bad", f"sft.from_run={tmp_path / 'rl'}"), progress=False)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(config(tmp_path / "none", f"sft.from_run={tmp_path / 'nothing'}"), progress=False)
