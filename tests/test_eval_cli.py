"""``capo eval`` with panels, repeats and pass@k (capo_train/eval_panel.py, eval_stats.py, eval_cli.py).

Most tests drive a scripted policy (doors chosen by a rule, no model) so a 64-task panel runs in a second;
one runs a real tiny checkpoint end to end through the command line on a 2-task panel."""

from __future__ import annotations

import json
import math
import random
from itertools import combinations

import pytest

from capo_envs.core import panels
from capo_envs.core.panels import Panel
from capo_train import eval_panel
from capo_train.backends.base import Generation
from capo_train.cli import main
from capo_train.eval_panel import EvalError, EvalRequest, Policy, run_eval
from capo_train.eval_stats import bootstrap_interval, pass_at_k, pass_at_ks, success_summary, wilson_interval


class DoorBackend:
    """Answers every SynthChain decision with a door: always ``left``, or drawn from the call's seed."""

    def __init__(self, tokenizer, rule: str = "left"):
        self.tokenizer, self.rule = tokenizer, rule

    def generate(self, prompts, *, stop, max_new_tokens, temperature=1.0, greedy=False, seed=None):
        rng = random.Random(seed)
        out = []
        for _ in prompts:
            door = "left" if self.rule == "left" else rng.choice(["left", "right"])
            text = f"<go>{door}</go>"
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Generation(token_ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason="stop"))
        return out


@pytest.fixture(scope="module")
def tokenizer():
    from capo_train.models import make_tiny_tokenizer

    return make_tiny_tokenizer()


@pytest.fixture
def scripted(monkeypatch, tokenizer):
    """Replace policy loading by a :class:`DoorBackend`; returns a setter for its rule."""
    state = {"rule": "left"}

    def fake_load(request, batch_size):
        return Policy(DoorBackend(tokenizer, state["rule"]), tokenizer, "scripted", state["rule"])

    monkeypatch.setattr(eval_panel, "load_policy", fake_load)
    return state


# ----------------------------------------------------------------------------- the statistics


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """The definition: the share of k-subsets of the n episodes that hold a success."""
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(("n", "c", "k"), [(1, 0, 1), (1, 1, 1), (4, 1, 2), (5, 2, 3), (8, 3, 4), (8, 0, 8), (6, 6, 2)])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k))


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(3, 4, 1)


def test_pass_at_ks_lists_powers_of_two_and_n_and_counts_only_perfect_episodes():
    got = pass_at_ks([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.5, 0.5, 1.0, 1.0, 0.0, 0.0]])
    assert list(got) == ["1", "2", "4", "6"]
    assert got["1"] == pytest.approx((1 / 6 + 2 / 6) / 2)  # the 0.5s are not successes
    assert got["6"] == 1.0


def test_wilson_interval_matches_a_hand_computation():
    low, high = wilson_interval(5, 10)  # p = 0.5, n = 10, z = 1.96: 0.5 -/+ 0.2634
    assert (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 20)[0] == 0.0 and 0 < wilson_interval(0, 20)[1] < 0.2


def test_summary_says_which_interval_and_is_reproducible():
    single = success_summary([[1.0], [0.0], [1.0], [1.0]])
    assert single["ci_method"].startswith("Wilson") and single["mean"] == 0.75
    repeated = success_summary([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    assert repeated["ci_method"].startswith("percentile bootstrap over 3 tasks")
    assert repeated["ci95"] == success_summary([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])["ci95"]
    assert repeated["ci95"][0] <= repeated["mean"] <= repeated["ci95"][1]
    assert "std_over_repeats" in repeated
    assert bootstrap_interval([0.5] * 7) == (0.5, 0.5)


def test_repeats_that_all_fail_still_get_an_interval_of_some_width():
    """64 tasks x 2 repeats, every episode failed (a random tiny model on synthchain-k4-test-64): the bootstrap
    alone says [0, 0]; one pass over 64 tasks cannot rule out a success rate of a few percent."""
    summary = success_summary([[0.0, 0.0]] * 64)
    assert summary["ci95"] == [0.0, wilson_interval(0, 64)[1]] and summary["ci95"][1] > 0.05
    assert "Wilson's interval over the 64 tasks" in summary["ci_method"]
    mixed = success_summary([[1.0, 0.0]] * 10)  # every task 0.5: again nothing for the bootstrap to resample
    assert mixed["ci95"][0] < 0.5 < mixed["ci95"][1]


# ----------------------------------------------------------------------------- a run on a panel


def test_panel_run_reports_success_ci_pass_at_k_and_per_task_rows(scripted, tmp_path):
    request = EvalRequest(policy="scripted", panel="synthchain-k4-test-64", repeats=2, record=str(tmp_path / "rec"))
    result = run_eval(request)
    assert result["panel"]["name"] == "synthchain-k4-test-64"
    assert result["panel"]["hash"] == panels.PANELS["synthchain-k4-test-64"].pinned_hash
    assert result["panel"]["matches_pin"] is True
    assert (result["tasks"], result["repeats"], result["episodes"]) == (64, 2, 128)
    # always "left" is deterministic, so every task's two repeats agree and pass@2 = pass@1 = success
    assert result["pass_at_k"]["1"] == pytest.approx(result["success"]["mean"])
    assert result["pass_at_k"]["2"] == pytest.approx(result["success"]["mean"])
    assert 0 < result["success"]["mean"] < 1  # some tasks' right doors are all on the left, most are not
    assert result["invalid_action_rate"] == 0.0 and result["episode_actions"]["mean"] == 4.0
    rows = [json.loads(line) for line in (tmp_path / "rec" / "per_task.jsonl").read_text().splitlines()]
    assert len(rows) == 64 and all(r["repeats"] == 2 and len(r["success"]) == 2 for r in rows)
    assert {(r["panel"], r["panel_hash"]) for r in rows} == {("synthchain-k4-test-64", result["panel"]["hash"])}
    saved = json.loads((tmp_path / "rec" / "eval_result.json").read_text())
    assert saved["panel"]["hash"] == result["panel"]["hash"] and "per_task" not in saved
    assert (tmp_path / "rec" / "episodes" / "eval-000000.jsonl").is_file()  # capo view reads it
    assert (tmp_path / "rec" / "replay.jsonl").is_file()


def test_sampled_repeats_raise_pass_at_k_and_the_same_seed_gives_the_same_figures(scripted):
    scripted["rule"] = "seeded"
    request = dict(policy="scripted", panel="synthchain-k4-test-64", repeats=4, seed=7)
    first, again = run_eval(EvalRequest(**request)), run_eval(EvalRequest(**request))
    assert first["pass_at_k"]["4"] > first["pass_at_k"]["1"]
    for key in ("success", "pass_at_k", "env_metrics"):
        assert first[key] == again[key]
    other = run_eval(EvalRequest(**{**request, "seed": 8}))
    assert other["success"]["mean"] != first["success"]["mean"] or other["pass_at_k"] != first["pass_at_k"]


def test_data_that_does_not_match_the_pin_is_refused_saying_what_differs(scripted, monkeypatch):
    pinned = panels.PANELS["synthchain-k4-test-64"]
    changed = Panel(**{**pinned.__dict__, "pinned": {**pinned.pinned, "tasks": "0000000000000000"}})
    monkeypatch.setitem(panels.PANELS, pinned.name, changed)
    with pytest.raises(EvalError, match=r"does not match the pinned panel[\s\S]*tasks: pinned 0000000000000000"):
        run_eval(EvalRequest(policy="scripted", panel=pinned.name))


def test_unpinned_panel_runs_and_says_it_is_not_pinned(scripted, monkeypatch):
    monkeypatch.setitem(panels.PANELS, "tiny-unpinned", Panel("tiny-unpinned", "capo/SynthChain-v0", "test", 3, {"k": 1}))
    result = run_eval(EvalRequest(policy="scripted", panel="tiny-unpinned"))
    assert result["panel"]["matches_pin"] is None and result["panel"]["hash"].startswith("sha256:")
    assert any("not pinned yet" in note for note in result["notes"])
    assert result["success"]["ci_method"].startswith("Wilson")  # one greedy episode per task


def test_without_a_panel_the_held_out_tasks_are_the_trainers(scripted):
    result = run_eval(EvalRequest(policy="scripted", env_id="capo/SynthChain-v0", split="dev", episodes=5,
                                  env_kwargs={"k": 2}))
    assert result["panel"] is None and result["tasks"] == 5
    assert result["env"]["kwargs"] == {"k": 2, "split": "dev"}


# ----------------------------------------------------------------------------- the command line


@pytest.mark.parametrize(("argv", "message"), [
    (["--panel", "synthchain-test-64", "--checkpoint", "x"], "unknown panel 'synthchain-test-64'; did you mean"),
    (["--panel", "synthchain-k4-test-64", "--checkpoint", "x", "--env", "capo/SynthHop-v0"], "fixes the env"),
    (["--panel", "synthchain-k4-test-64", "--checkpoint", "x", "k=3"], "fixes the env"),
    (["--panel", "synthchain-k4-test-64", "--checkpoint", "x", "--repeats", "0"], "--repeats must be >= 1"),
    (["--panel", "synthchain-k4-test-64", "--checkpoint", "x", "--temperature", "-1"], "--temperature must be"),
    (["--panel", "synthchain-k4-test-64"], "say which policy"),
    (["--panel", "synthchain-k4-test-64", "--checkpoint", "/nonexistent/dir"], "neither a capo checkpoint"),
])
def test_bad_input_is_one_clear_sentence(argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", *argv])
    assert message in str(exit_info.value)


def test_panels_lists_every_panel_with_its_hash(capsys):
    assert main(["eval", "--panels"]) == 0
    out = capsys.readouterr().out
    assert panels.PANELS["synthhop-test-100"].pinned_hash in out and "hotpotqa-dev-500" in out
    assert "not pinned yet" in out


def test_a_server_that_refuses_a_request_is_one_clear_sentence(tmp_path, monkeypatch):
    """`capo serve` refuses prompts longer than its --max-model-len; `capo eval --server` says so, no traceback
    (found running a 512-position tiny model on a SynthChain k=4 panel)."""
    from capo_train.backends.hf import HFBackend
    from capo_train.backends.server import serve
    from capo_train.models import make_tiny_llama

    model, tokenizer = make_tiny_llama(hidden_size=32, num_layers=2, seed=3)
    model.save_pretrained(tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")
    monkeypatch.setitem(panels.PANELS, "tiny-chain", Panel("tiny-chain", "capo/SynthChain-v0", "test", 2, {"k": 1}))
    server = serve(HFBackend(model.eval(), tokenizer), tokenizer, "tiny", max_model_len=64)
    try:
        with pytest.raises(SystemExit, match=r"capo eval: .*refused the request: HTTP 400: .*exceeds max_model_len=64"):
            main(["eval", "--checkpoint", str(tmp_path / "hf"), "--server", server.url, "--served-model", "tiny",
                  "--panel", "tiny-chain"])
    finally:
        server.close()


def test_a_tiny_checkpoint_end_to_end_then_reverified(tmp_path, monkeypatch, capsys):
    """A real checkpoint through ``capo eval --panel --repeats --record``, then ``--reverify`` of the recording."""
    from capo_train.models import ActorCritic, make_tiny_llama, save_checkpoint

    model, tokenizer = make_tiny_llama(hidden_size=32, num_layers=2, seed=3)
    save_checkpoint(tmp_path / "run" / "checkpoint", ActorCritic(model, meta={"lora": None, "critic": None}), tokenizer)
    # the run's own rollout settings are the eval's (a trainer-written config.json; others keep their defaults)
    (tmp_path / "run" / "checkpoint" / "config.json").write_text(json.dumps({"rollout": {"max_action_tokens": 6}}))
    monkeypatch.setitem(panels.PANELS, "tiny-chain", Panel("tiny-chain", "capo/SynthChain-v0", "test", 2, {"k": 1}))
    argv = ["eval", "--checkpoint", str(tmp_path / "run"), "--panel", "tiny-chain", "--repeats", "2", "--seed", "3"]
    assert main([*argv, "--record", str(tmp_path / "rec")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["policy"]["kind"] == "checkpoint" and result["episodes"] == 4
    assert result["invalid_action_rate"] == 1.0  # random weights write no valid door
    assert result["rollout"]["max_action_tokens"] == 6 and result["rollout"]["from"] == "the run's config.json"
    assert result["action_tokens"]["max"] <= 6 and math.isfinite(result["action_tokens"]["mean"])
    assert main([*argv, "--out", str(tmp_path / "again.json")]) == 0  # same seed: the same episodes
    again = json.loads(capsys.readouterr().out)
    assert again["action_tokens"] == result["action_tokens"] and again["success"] == result["success"]
    assert main(["eval", "--reverify", str(tmp_path / "rec")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["episodes"] == 4 and report["differing_episodes"] == 0
