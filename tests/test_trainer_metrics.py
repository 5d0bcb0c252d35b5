"""docs/metrics.md lists every key the trainer logs: tiny runs (a warm start, held-out evaluations, a
critic, the action-level ratio; then a token-ratio group method) log only keys the table names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from capo_train.trainer import train

from test_trainer import config_for

METRICS_DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def documented() -> list[str]:
    """The first column of every table row of docs/metrics.md: ``| `key` | ...``."""
    return re.findall(r"^\| `([^`]+)` \|", METRICS_DOC.read_text(), flags=re.MULTILINE)


def is_documented(key: str, names: list[str]) -> bool:
    """``key`` is listed, or matches a listed family (``<name>`` stands for one path segment); an
    ``eval/<name>`` key needs ``rollout/<name>`` listed, the log-prob gap aside (training rollouts only)."""
    if key.startswith("eval/"):
        rollout = [n for n in names if n.startswith("rollout/") and not n.startswith("rollout/logprob_gap")]
        return is_documented("rollout/" + key.removeprefix("eval/"), rollout)
    for name in names:
        pattern = "".join("[^/]+" if part.startswith("<") else re.escape(part) for part in re.split(r"(<[^>]+>)", name))
        if re.fullmatch(pattern, key):
            return True
    return False


def logged_keys(out_dir: Path) -> set[str]:
    return {key for line in (out_dir / "log.jsonl").read_text().splitlines() for key in json.loads(line)}


def test_the_table_parses_and_knows_its_families():
    names = documented()
    assert len(names) > 50 and len(names) == len(set(names))
    assert is_documented("rollout/env_em", names) and is_documented("eval/env_f1", names)
    assert is_documented("eval/success", names) and not is_documented("eval/logprob_gap_mean", names)
    assert not is_documented("actor/made_up", names)


@pytest.mark.parametrize("extra", [
    ["algo=capo", "sft.state_loss_coef=0.5"],  # warm start, evaluations, boundary critic, action ratio, KL
    ["algo=grpo", "iterations=1", "sft.episodes=0", "eval_every=0", "model.lora=false",
     "rollout.recompute_logprobs=true"],  # token ratio, no critic, recomputed old log-probs
], ids=["capo", "grpo"])
def test_every_logged_key_is_in_docs_metrics(tiny_model_dir, tmp_path, extra):
    train(config_for(tiny_model_dir, tmp_path, *extra), progress=False)
    names = documented()
    missing = sorted(key for key in logged_keys(tmp_path) if not is_documented(key, names))
    assert not missing, f"logged but not in docs/metrics.md: {missing}"
