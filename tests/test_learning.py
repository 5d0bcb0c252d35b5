"""Training makes an agent better: a tiny model, trained from scratch, learns SynthChain with capo and grpo.

Setting (deterministic by seed on the CPU): a 2-layer Llama with a byte-level tokenizer, randomly
initialised, is behaviour-cloned on a demonstrator that is right half the time (``expert_skill=0.5``) on
``capo/SynthChain-v0`` with ``k=2`` doors; at temperature 1 the clone then picks the signed door ~3 times
in 4 and succeeds (both doors right) about half the time. RL (full fine-tune, 16 episodes an iteration)
must push that up.

The criterion, and why noise does not reach it: training success (every sampled rollout) over the last
``WINDOW`` iterations must exceed the first ``WINDOW`` iterations' by ``MARGIN``. Each window holds
``WINDOW x 16`` = 240 episodes, so at a success rate near 0.5 the standard error of a window's mean is
<= 0.033 and of the difference of two windows <= 0.046: ``MARGIN`` = 0.15 is more than 3 standard errors
above no change. Measured (2026-12-01, this test's settings): capo 0.550 -> 0.858, grpo 0.525 -> 0.704.
Negating the advantages, detaching the policy loss, or computing the loss on each action's observation
tokens instead of its own each makes the test fail (docs/results/learning.md, section 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capo_train.config import load_config
from capo_train.models import export_actor, make_tiny_llama
from capo_train.trainer import train

ITERATIONS = 60
WINDOW = 15
MARGIN = 0.15
RUN = [
    "env.id=capo/SynthChain-v0",
    "env.kwargs={k: 2, expert_skill: 0.5}",
    "model.lora=false",
    "rollout.episodes_per_batch=16",
    "rollout.max_action_tokens=24",
    "optim.minibatch_rows=8",
    "eval_every=0",
    "log_tensorboard=false",
    "log_entropy=false",
]


def build_warm_start(root: Path) -> Path:
    """The behaviour-cloned tiny model under ``root``, exported as a plain HF folder (``root/warm``)."""
    model, tokenizer = make_tiny_llama(hidden_size=64, num_layers=2, seed=0)
    model.save_pretrained(root / "init")
    tokenizer.save_pretrained(root / "init")
    config = load_config(None, [f"model.path={root / 'init'}", f"out_dir={root / 'sft'}", *RUN,
                                "sft.episodes=256", "sft.epochs=6", "optim.actor_lr=1e-3"])
    config.iterations = 0  # the warm start only, as `capo sft` does
    train(config, progress=False)
    return export_actor(root / "sft" / "checkpoint", root / "warm")


@pytest.fixture(scope="module")
def warm_start(tmp_path_factory):
    """One warm start for every RL run below."""
    return build_warm_start(tmp_path_factory.mktemp("learning"))


def training_success(out_dir) -> list[float]:
    records = [json.loads(line) for line in (out_dir / "log.jsonl").read_text().splitlines()]
    return [r["rollout/success"] for r in records if r["iteration"] >= 1]


@pytest.mark.slow
@pytest.mark.parametrize("algo, lr", [("capo", "1e-3"), ("grpo", "3e-4")])
def test_rl_raises_training_success_beyond_noise(warm_start, tmp_path, algo, lr):
    config = load_config(None, [f"model.path={warm_start}", f"out_dir={tmp_path}", f"algo={algo}", *RUN,
                                f"iterations={ITERATIONS}", "sft.episodes=0", f"optim.actor_lr={lr}"])
    train(config, progress=False)
    success = training_success(tmp_path)
    assert len(success) == ITERATIONS
    first, last = sum(success[:WINDOW]) / WINDOW, sum(success[-WINDOW:]) / WINDOW
    print(f"{algo}: training success {first:.3f} -> {last:.3f}")
    assert last - first >= MARGIN, f"{algo}: training success {first:.3f} -> {last:.3f}, gain < {MARGIN}"
