"""docs/scaleout.md's multi-node verl example composes with the installed verl's own ``ppo_trainer.yaml``
(Hydra), and its actor and critic sections validate as verl's dataclasses: every key in the documented
command exists and selects CAPO's registered pieces. The model paths are swapped for a tiny local model
(no download). Runs in the verl venv.
"""

import copy
import os
import shlex
from pathlib import Path

import pytest

pytest.importorskip("verl")

DOC = Path(__file__).resolve().parents[1] / "docs" / "scaleout.md"


def example_overrides() -> list[str]:
    text = DOC.read_text()
    block = text.split("<!-- verl-example:begin -->")[1].split("<!-- verl-example:end -->")[0]
    command = block.split("```bash")[1].split("```")[0].replace("\\\n", " ")
    tokens = shlex.split(command)
    assert tokens[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    return tokens[3:]


@pytest.fixture(scope="module")
def example_config(tmp_path_factory):
    import verl
    from hydra import compose, initialize_config_dir

    from capo_train.models import make_tiny_llama

    model_dir = tmp_path_factory.mktemp("tiny")
    model, tokenizer = make_tiny_llama()
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    overrides = [o.replace("Qwen/Qwen3-1.7B", str(model_dir)) for o in example_overrides()]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def test_documented_example_composes_with_verls_config(example_config):
    from verl.utils.config import omega_conf_to_dataclass

    import capo_train.integrations.verl.plugin as plugin

    cfg = example_config
    assert cfg.trainer.use_v1 and cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node == 16
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn
    from verl.trainer.ppo.v1 import get_trainer_cls

    assert get_trainer_cls(cfg.trainer.v1.trainer_mode).__name__ == "CapoSyncTrainer"
    assert get_adv_estimator_fn(cfg.algorithm.adv_estimator)  # registered name
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop in _agent_loop_registry
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert get_policy_loss_fn(actor.policy_loss.loss_mode) is plugin.losses.capo_action_ratio
    assert actor.clip_ratio_low == actor.clip_ratio_high == 0.001
    critic = omega_conf_to_dataclass(cfg.critic)
    assert critic.enable and critic.cliprange_value == 0.5


def test_the_trainer_builds_from_it_as_verls_sync_trainer(example_config):
    """``trainer_mode`` goes back to ``sync`` before verl reads it (verl tests ``== "sync"`` in several
    places), so everything but the advantage step and the critic loss is PPOTrainerSync's."""
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

    cfg = copy.deepcopy(example_config)
    trainer = get_trainer_cls(cfg.trainer.v1.trainer_mode)(cfg)
    assert trainer.trainer_mode == "sync" and type(trainer.replay_buffer) is ReplayBuffer
    assert trainer.use_critic and trainer.capo_boundary_critic
    assert (trainer.capo_estimator, trainer.capo_overrides) == ("capo_action_gae", {"gamma": 0.99, "lam": 1.0})
