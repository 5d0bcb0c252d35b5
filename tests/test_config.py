import pytest

from capo_train.config import ConfigError, TrainConfig, load_config, parse_overrides


def test_defaults_are_the_embedded_run():
    config = load_config()
    assert config == TrainConfig()
    assert (config.algo, config.env.id, config.model.path) == ("capo", "capo/SynthHop-v0", "smollm2")


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algo: grpo\nrollout:\n  tasks_per_batch: 4\noptim:\n  actor_lr: 1e-5\n")
    config = load_config(path, ["rollout.tasks_per_batch=2", "env.kwargs={size: tiny}", "optim.critic_lr=2"])
    assert config.algo == "grpo" and config.rollout.tasks_per_batch == 2
    assert config.optim.actor_lr == 1e-5 and config.optim.critic_lr == 2.0
    assert config.env.kwargs == {"size": "tiny"}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo=capo2"], "unknown algorithm 'capo2'"),
        (["rollout.tasks_per_bach=3"], "did you mean 'rollout.tasks_per_batch'"),
        (["nonsense=1"], "unknown config key 'nonsense'"),
        (["iterations=ten"], "iterations expects int"),
        (["iterations=0"], "iterations must be >= 1"),
        (["sft.tasks=-5"], "sft.tasks must be >= 0"),
        (["optim=3"], "optim is a section"),
        (["rollout.layout=packed", "rollout.state=window"], "packed needs rollout.state=concat"),
        (["model.lora=maybe"], "model.lora expects bool"),
        (["oops"], "expected key=value"),
        (["env.id=capo/SynthHopp-v0"], "did you mean 'capo/SynthHop-v0'"),
    ],
)
def test_bad_config_has_a_clear_message(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, overrides)


def test_parse_overrides_nests():
    assert parse_overrides(["a.b.c=1", "a.d=x", "e="]) == {"a": {"b": {"c": 1}, "d": "x"}, "e": ""}


def test_algo_overrides_another_algorithm_uses_are_dropped_typos_are_errors():
    from capo_train.trainer import algorithm_settings

    _, settings = algorithm_settings(load_config(None, ["algo=capo", "algo_overrides={whiten_std_floor: 0.1}"]))
    assert settings["whiten_std_floor"] == 0.1
    _, settings = algorithm_settings(load_config(None, ["algo=grpo", "algo_overrides={whiten_std_floor: 0.1}"]))
    assert "whiten_std_floor" not in settings  # GRPO does not whiten over the batch
    with pytest.raises(ValueError, match="gammma"):
        algorithm_settings(load_config(None, ["algo=capo", "algo_overrides={gammma: 0.9}"]))
