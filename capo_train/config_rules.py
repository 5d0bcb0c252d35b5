"""The range of every config value: ``CONFIG_RULES`` for ``TrainConfig``'s keys, ``ALGO_SETTING_RULES`` for
the algorithm hyperparameters in ``algo_overrides``. ``capo_train.config.validate`` applies them."""

from __future__ import annotations

import math
from typing import Any, Callable

from .errors import ConfigError

Rule = tuple[Callable[[Any], bool], str]  # (accepts(value), what it accepts, for the message)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int_at_least(low: int) -> Rule:
    return (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low), f">= {low} (an integer)"


def _number_above(low: float, *, inclusive: bool = False) -> Rule:
    if inclusive:
        return (lambda v: _is_number(v) and v >= low), f"a finite number >= {low}"
    return (lambda v: _is_number(v) and v > low), f"a finite number > {low}"


def _one_of(*options: Any) -> Rule:
    return (lambda v: isinstance(v, str) and v in options), "one of " + ", ".join(map(repr, options))


def _or_null(rule: Rule) -> Rule:
    return (lambda v: v is None or rule[0](v)), f"{rule[1]}, or null"


POSITIVE = _number_above(0)
NON_NEGATIVE = _number_above(0, inclusive=True)
UNIT = (lambda v: _is_number(v) and 0 <= v <= 1), "a number in [0, 1]"
BOOL = (lambda v: isinstance(v, bool)), "true or false"
NAME = (lambda v: isinstance(v, str) and v.strip() != ""), "a non-empty string"
PATH_OR_EMPTY = (lambda v: isinstance(v, str)), "a folder path, or \"\" for none"
DTYPES = ("float32", "bfloat16", "float16")

# Every TrainConfig value but the ones with checks of their own (algo, env.id, env.kwargs, algo_overrides)
# and the booleans (typed when read). A test keeps this in step with the dataclasses.
CONFIG_RULES: dict[str, Rule] = {
    "iterations": _int_at_least(1),
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "device": _one_of("auto", "cpu"),
    "out_dir": _or_null(NAME),
    "eval_every": _int_at_least(0),
    "eval_episodes": _int_at_least(0),
    "record_every": _int_at_least(0),
    "record_episodes": _int_at_least(1),
    "model.path": NAME,
    "model.dtype": _one_of(*DTYPES),
    "model.lora_r": _int_at_least(1),
    "model.lora_alpha": _int_at_least(1),
    "model.lora_last_layers": _int_at_least(0),
    "model.critic": _one_of("shared", "separate"),
    "env.train_split": NAME,
    "env.eval_split": NAME,
    "rollout.episodes_per_batch": _int_at_least(1),
    "rollout.tasks_per_batch": _int_at_least(0),
    "rollout.group_size": _int_at_least(0),
    "rollout.state": _one_of("concat", "window"),
    "rollout.window": _int_at_least(0),
    "rollout.earlier_actions": _int_at_least(-1),
    "rollout.layout": _one_of("packed", "per_action"),
    "rollout.max_action_tokens": _int_at_least(1),
    "rollout.max_prompt_tokens": _int_at_least(1),
    "rollout.temperature": POSITIVE,
    "rollout.env_pool": _one_of("serial", "thread", "process"),
    "rollout.env_workers": _or_null(_int_at_least(1)),
    "rollout.backend": _one_of("hf", "vllm"),
    "rollout.vllm_gpu_memory_utilization": ((lambda v: _is_number(v) and 0 < v <= 1), "a number in (0, 1]"),
    "rollout.recompute_logprobs": _or_null(BOOL),
    "rollout.reuse_common_prefix": _or_null(BOOL),
    "optim.actor_lr": _or_null(POSITIVE),
    "optim.critic_lr": POSITIVE,
    "optim.weight_decay": NON_NEGATIVE,
    "optim.grad_clip": POSITIVE,
    "optim.ppo_epochs": _int_at_least(1),
    "optim.minibatch_rows": _int_at_least(1),
    "optim.target_kl": _or_null(POSITIVE),
    "optim.critic_warmup": _int_at_least(0),
    "sft.episodes": _int_at_least(0),
    "sft.tasks": _int_at_least(0),
    "sft.epochs": _int_at_least(1),
    "sft.lr": POSITIVE,
    "sft.minibatch_rows": _int_at_least(1),
    "sft.warmup_frac": UNIT,
    "sft.lr_schedule": _one_of("constant", "cosine"),
    "sft.state_loss_coef": NON_NEGATIVE,
    "sft.expert_skill": UNIT,
    "sft.from_run": PATH_OR_EMPTY,
}

# Every hyperparameter an algorithm reads (its registry defaults and the keys it routes to its estimator
# and loss: Algorithm.setting_names in capo_train/algorithms/registry.py). A test keeps this in step.
ALGO_SETTING_RULES: dict[str, Rule] = {
    "clip_low": POSITIVE,
    "clip_high": POSITIVE,
    "dual_clip": _or_null(_number_above(1)),  # null: off
    "token_scale": _one_of("exact", "inv_len"),
    "ratio_mode": _one_of("capo", "geomean", "sum"),
    "max_log_ratio": POSITIVE,
    "mu": _or_null((_is_number, "a finite number")),
    "agg": _one_of("seq-mean-token-mean", "token-mean", "seq-mean-token-sum"),
    "kl_coef": NON_NEGATIVE,
    "kl_type": _one_of("k1", "kl", "k2", "mse", "k3", "low_var_kl"),
    "kl_in_reward": BOOL,
    "entropy_coef": NON_NEGATIVE,
    "value_cliprange": POSITIVE,
    "group_size": _int_at_least(1),
    "gamma": UNIT,
    "lam": UNIT,
    "bootstrap_truncated": BOOL,
    "whiten_advantages": BOOL,
    "whiten_std_floor": NON_NEGATIVE,
    "whiten_level": _one_of("token", "row"),
    "norm_by_std": BOOL,
    "eps": POSITIVE,
    "omega": NON_NEGATIVE,
    "step_norm": _one_of("mean_std", "mean"),
}


def check_value(key: str, value: Any, rule: Rule) -> None:
    """Raise a ConfigError naming ``key`` and what it accepts unless ``rule`` accepts ``value``."""
    accepts, what = rule
    try:
        ok = accepts(value)
    except TypeError:  # a value of another type built in code (the YAML path types it first)
        ok = False
    if not ok:
        raise ConfigError(f"{key} must be {what}, got {value!r}")


def value_at(config: Any, key: str) -> Any:
    """The value of a dotted ``key`` (``rollout.window``) in a config dataclass."""
    obj = config
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj
