"""capo_train.integrations.verl: the verl.plugins entry point registers CAPO in a fresh process.

Runs in the verl venv only (``bash scripts/verl_venv.sh``; ``.venv-verl/bin/python -m pytest -q
tests/test_verl_*.py``); skipped where verl is not installed.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("verl")

PROBE = r"""
import json, sys
import verl  # loads every verl.plugins entry point, ours among them
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
from verl.trainer.ppo.v1 import get_trainer_cls
loaded = "capo_train.integrations.verl.plugin" in sys.modules
out = {"loaded": loaded, "losses": sorted(n for n in POLICY_LOSS_REGISTRY if n.startswith("capo_")),
       "estimators": sorted(n for n in ADV_ESTIMATOR_REGISTRY if n.startswith("capo_")),
       "agent_loop": _agent_loop_registry.get("capo_env")}
try:
    out["trainer"] = get_trainer_cls("capo_sync").__name__
except ValueError:
    out["trainer"] = None
from capo_train.integrations.verl.plugin import registration_problems  # registers here if verl did not
out["problems"] = registration_problems()
print("RESULT" + json.dumps(out))
"""


def probe(**env) -> dict:
    """Run PROBE in a fresh interpreter (nothing imported by this test process can leak in)."""
    run_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=run_env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def test_import_verl_registers_everything_in_a_fresh_process():
    from capo_train.integrations.verl.core import ESTIMATORS, LOSSES

    out = probe(VERL_USE_EXTERNAL_PLUGINS="auto")
    assert out["loaded"]
    assert out["losses"] == sorted(LOSSES)
    assert out["estimators"] == sorted(ESTIMATORS)
    assert out["agent_loop"] == {"_target_": "capo_train.integrations.verl.agent_loop.CapoEnvAgentLoop"}
    assert out["trainer"] == "CapoSyncTrainer"
    assert out["problems"] == []


def test_a_disabled_plugin_is_reported_not_silently_skipped():
    """verl skips plugins silently when told to (or when one fails to import); our startup check says so."""
    out = probe(VERL_USE_EXTERNAL_PLUGINS="none")
    assert not out["loaded"] and out["trainer"] is None and out["losses"] == []
    assert any("VERL_USE_EXTERNAL_PLUGINS" in p for p in out["problems"]), out["problems"]


def test_registered_estimators_refuse_the_stock_call():
    import capo_train.integrations.verl.plugin  # noqa: F401
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    fn = get_adv_estimator_fn("capo_action_gae")
    with pytest.raises(RuntimeError, match="capo_sync"):
        fn(token_level_rewards=None, response_mask=None, config=None)


def test_trainer_settings_come_from_the_verl_config():
    from omegaconf import OmegaConf

    from capo_train.integrations.verl.trainer import estimator_settings

    cfg = OmegaConf.create({"algorithm": {"adv_estimator": "capo_action_gae", "gamma": 0.95, "lam": 0.9},
                            "capo": {"estimator": {"whiten_std_floor": 0.1}}})
    assert estimator_settings(cfg) == ("capo_action_gae", {"gamma": 0.95, "lam": 0.9, "whiten_std_floor": 0.1})
    cfg.algorithm.adv_estimator = "capo_grpo"  # GRPO reads neither gamma nor lam
    assert estimator_settings(cfg) == ("capo_grpo", {})
    cfg.algorithm.adv_estimator = "gae"
    with pytest.raises(ValueError, match="capo_action_gae"):
        estimator_settings(cfg)


def test_trainer_start_checks_its_registrations(monkeypatch):
    from omegaconf import OmegaConf

    from capo_train.integrations.verl.trainer import CapoSyncTrainer

    monkeypatch.setenv("VERL_USE_EXTERNAL_PLUGINS", "none")  # verl's workers would not load the plugin
    with pytest.raises(RuntimeError, match="not fully registered"):
        CapoSyncTrainer(OmegaConf.create({"algorithm": {"adv_estimator": "capo_action_gae"}}))
