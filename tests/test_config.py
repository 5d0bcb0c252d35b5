import re

import pytest

from capo_train.config import ConfigError, TrainConfig, load_config, parse_overrides


def test_defaults_are_the_embedded_run():
    config = load_config()
    assert config == TrainConfig(out_dir="runs/capo-synthchain")  # the run folder is named after the env
    assert (config.algo, config.env.id, config.model.path) == ("capo", "capo/SynthChain-v0", "smollm2")
    assert load_config(overrides=["algo=grpo", "env.id=capo/SynthHouse-v0"]).out_dir == "runs/grpo-synthhouse"
    assert load_config(overrides=["out_dir=elsewhere"]).out_dir == "elsewhere"


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
    from capo_train.algorithms import get

    def bound(*overrides):
        config = load_config(None, list(overrides))
        return get(config.algo).bind(config.algo_overrides)

    assert bound("algo=capo", "algo_overrides={whiten_std_floor: 0.1}").settings["whiten_std_floor"] == 0.1
    assert "whiten_std_floor" not in bound("algo=grpo", "algo_overrides={whiten_std_floor: 0.1}").settings
    with pytest.raises(ValueError, match="gammma"):  # the config check, before any algorithm is bound
        bound("algo=capo", "algo_overrides={gammma: 0.9}")
    with pytest.raises(ValueError, match="gammma"):  # and bind's own, for settings built in code
        get("capo").bind({"gammma": 0.9})


# Each of these used to load (and then run, or fail with a raw traceback later).
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optim.actor_lr=-1"], "optim.actor_lr must be a finite number > 0, or null, got -1.0"),
        (["optim.actor_lr=nan"], "optim.actor_lr must be a finite number > 0"),
        (["optim.critic_lr=.inf"], "optim.critic_lr must be a finite number > 0, got inf"),
        (["optim.weight_decay=-0.1"], "optim.weight_decay must be a finite number >= 0"),
        (["optim.grad_clip=0"], "optim.grad_clip must be a finite number > 0"),
        (["optim.ppo_epochs=0"], "optim.ppo_epochs must be >= 1"),
        (["model.dtype=foo"], "model.dtype must be one of 'float32', 'bfloat16', 'float16', got 'foo'"),
        (["model.lora_r=0"], "model.lora_r must be >= 1"),
        (["model.lora_last_layers=-1"], "model.lora_last_layers must be >= 0"),
        (["model.path="], "model.path must be a non-empty string"),
        (["rollout.group_size=-2"], "rollout.group_size must be >= 0 (an integer), got -2"),
        (["rollout.episodes_per_batch=0"], "rollout.episodes_per_batch must be >= 1"),
        (["rollout.window=-1"], "rollout.window must be >= 0"),
        (["rollout.earlier_actions=-2"], "rollout.earlier_actions must be >= -1"),
        (["rollout.earlier_actions=3"], "rollout.earlier_actions needs rollout.state=window"),
        (["rollout.max_prompt_tokens=0"], "rollout.max_prompt_tokens must be >= 1"),
        (["rollout.temperature=0"], "rollout.temperature must be a finite number > 0"),
        (["eval_episodes=-1"], "eval_episodes must be >= 0"),
        (["eval_every=-3"], "eval_every must be >= 0"),
        (["sft.epochs=0"], "sft.epochs must be >= 1"),
        (["sft.lr=-1e-3"], "sft.lr must be a finite number > 0"),
        (["sft.warmup_frac=1.5"], "sft.warmup_frac must be a number in [0, 1]"),
        (["sft.lr_schedule=linear"], "sft.lr_schedule must be one of 'constant', 'cosine'"),
        (["algo_overrides={kl_coef: -1}"], "algo_overrides.kl_coef must be a finite number >= 0, got -1"),
        (["algo_overrides={gamma: 1.5}"], "algo_overrides.gamma must be a number in [0, 1]"),
        (["algo_overrides={lam: -0.1}"], "algo_overrides.lam must be a number in [0, 1]"),
        (["algo_overrides={clip_low: 0}"], "algo_overrides.clip_low must be a finite number > 0"),
        (["algo_overrides={dual_clip: 0.5}"], "algo_overrides.dual_clip must be a finite number > 1, or null"),
        (["algo_overrides={kl_type: k9}"], "algo_overrides.kl_type must be one of 'k1'"),
        (["algo_overrides={group_size: 0}"], "algo_overrides.group_size must be >= 1"),
        (["algo_overrides={whiten_std_floor: fast}"], "algo_overrides.whiten_std_floor must be a finite number >= 0"),
        (["algo_overrides={kl_in_reward: 1}"], "algo_overrides.kl_in_reward must be true or false"),
        (["algo_overrides={gammma: 0.9}"], "unknown algo_overrides key 'gammma'; did you mean 'gamma'"),
        (["algo=grpo", "rollout.episodes_per_batch=12"],
         "episodes_per_batch (12) must be a multiple of the group size (8"),
        (["env.kwargs={split: dev}"], "env.kwargs must not set split"),
        (["env.kwargs=[1, 2]"], "env.kwargs expects dict"),
        (["env.kwargs={size: tiny"], "env.kwargs: cannot read '{size: tiny' as YAML"),
    ],
)
def test_every_value_is_range_checked_when_loaded(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides)


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    from capo_train.cli import main

    path = tmp_path / "run.yaml"
    path.write_text("algo: grpo\nrollout:\n  tasks_per_batch: [4\noptim: {}\n")
    with pytest.raises(ConfigError, match=rf"{path} is not valid YAML: line \d+, column \d+"):
        load_config(path)
    with pytest.raises(SystemExit, match=rf"^capo: {path} is not valid YAML: line \d+"):  # no traceback
        main(["train", "--config", str(path)])
    with pytest.raises(SystemExit, match=rf"^capo: cannot read {tmp_path / 'missing.yaml'}"):
        main(["train", "--config", str(tmp_path / "missing.yaml")])


def test_every_config_value_and_algorithm_setting_has_a_range():
    """The rule tables cover every field (bar the ones with their own checks) and every hyperparameter an
    algorithm takes, and every registry default is inside its range."""
    import dataclasses
    import inspect

    from capo_train.algorithms import ALGORITHMS
    from capo_train.config import ALGO_SETTING_RULES, CONFIG_RULES

    def leaves(obj, prefix=""):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                yield from leaves(value, f"{prefix}{f.name}.")
            elif not isinstance(value, bool):
                yield prefix + f.name

    own_checks = {"algo", "algo_overrides", "env.id", "env.kwargs"}
    assert set(leaves(TrainConfig())) - own_checks == set(CONFIG_RULES)
    def keyword_only(fn):
        return {p.name for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}

    for algo in ALGORITHMS.values():
        # the keys the registry routes to each function are exactly the ones it takes
        assert set(algo.estimator_keys) == keyword_only(algo.estimator), algo.name
        assert set(algo.loss_keys) == keyword_only(algo.policy_loss), algo.name
        names = algo.setting_names
        assert names <= set(ALGO_SETTING_RULES), (algo.name, names - set(ALGO_SETTING_RULES))
        load_config(None, [f"algo={algo.name}", f"algo_overrides={algo.defaults}".replace("None", "null")])


@pytest.mark.parametrize("overrides, shape", [
    ([], (16, 1)),  # capo: 16 tasks x 1
    (["algo=grpo"], (2, 8)),  # the same 16 episodes: 2 tasks x 8
    (["algo=grpo", "rollout.group_size=4"], (4, 4)),
    (["algo=rloo", "algo_overrides={group_size: 2}", "rollout.episodes_per_batch=8"], (4, 2)),
    (["algo=grpo", "rollout.tasks_per_batch=3"], (3, 8)),  # explicit tasks: tasks x G
])
def test_every_algorithm_gets_the_same_episodes_per_iteration_by_default(overrides, shape):
    from capo_train.config import batch_shape

    assert batch_shape(load_config(None, overrides)) == shape


def test_actor_lr_default_depends_on_the_model_kind():
    from capo_envs.core.registry import cpu_preset
    from capo_train.config import DEFAULT_ENV, default_actor_lr, env_kwargs

    assert load_config().optim.actor_lr is None  # auto, resolved by the trainer once the model is known
    assert default_actor_lr(lora=True, parameters=135_000_000) == 2e-4
    assert default_actor_lr(lora=False, parameters=6_496) == 1e-3
    assert default_actor_lr(lora=False, parameters=135_000_000) == 1e-5
    assert load_config(None, ["optim.actor_lr=2e-4"]).optim.actor_lr == 2e-4
    # env.kwargs null: the CPU preset for the ids that have one; another env gets its own defaults
    assert DEFAULT_ENV == "capo/SynthChain-v0"
    assert env_kwargs(load_config().env) == cpu_preset(DEFAULT_ENV) == {"k": 4, "expert_skill": 0.0}
    assert env_kwargs(load_config(None, ["env.id=capo_envs:capo/SynthHop-v0"]).env) == cpu_preset("capo/SynthHop-v0")
    assert cpu_preset("capo/SynthHop-v0")["question_kinds"] == ["bridge-2"]
    assert env_kwargs(load_config(None, ["env.id=capo/HotpotQA-v0"]).env) == {}


def test_a_mapping_override_updates_the_default_mapping_key_by_key():
    """`algo_overrides.clip_low=0.2` must not drop the default kl_coef=0 (which silently turned KL on)."""
    config = load_config(None, ["algo_overrides.clip_low=0.2"])
    assert config.algo_overrides == {"kl_coef": 0.0, "whiten_std_floor": 0.1, "clip_low": 0.2}
    config = load_config(None, ["algo_overrides={kl_coef: 0.001}", "algo_overrides.gamma=0.9"])
    assert config.algo_overrides == {"kl_coef": 0.001, "whiten_std_floor": 0.1, "gamma": 0.9}


@pytest.mark.parametrize("raw, value", [("3e-4", 3e-4), ("1E+2", 100.0), ("-2.5e-3", -2.5e-3), (".5e1", 5.0),
                                        ("3.0e-4", 3e-4), ("1e", "1e"), ("e5", "e5"), ("0x10", 16), ("7", 7)])
def test_exponent_floats_read_as_numbers(raw, value):
    """PyYAML (YAML 1.1) reads `3e-4` as a string, which made `algo_overrides.clip_low=3e-4` a type error."""
    assert parse_overrides([f"x={raw}"])["x"] == value
    assert load_config(None, ["algo_overrides.clip_low=3e-4"]).algo_overrides["clip_low"] == 3e-4


def test_every_env_preset_builds_its_env():
    """A preset with a misspelt or stale kwarg would fail only after the model has loaded."""
    import gymnasium as gym

    import capo_envs

    presets = {env_id: card.cpu_preset for env_id, card in capo_envs.CATALOG.items() if card.cpu_preset}
    assert {"capo/SynthChain-v0", "capo/SynthHop-v0", "capo/SynthScholar-v0", "capo/SynthHouse-v0"} <= set(presets)
    for env_id, kwargs in presets.items():
        card = capo_envs.CATALOG[env_id]
        if not card.data_ready():  # e.g. SynthHouse without the [alfworld] extra
            continue
        env = gym.make(env_id, **kwargs)
        try:
            observation, _ = env.reset(seed=0)
            assert isinstance(observation, str) and observation
        finally:
            env.close()
