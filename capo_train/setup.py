"""Building what a run needs before its first iteration: the envs, the model, its optimizers, the KL
reference, and the run folder's entries (``checkpoint/``, ``warm_start/``).

``train`` (``capo_train/trainer.py``) calls these in order; each is usable on its own (tests, benchmarks).
"""

from __future__ import annotations

import copy
import inspect
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

from .algorithms import BoundAlgorithm
from .backends.base import GenerationBackend
from .config import ConfigError, TrainConfig, default_actor_lr, env_kwargs, env_spec
from .envpool import EnvPool
from .models.actor_critic import ActorCritic, LoraSettings, build_actor_critic, load_reference
from .models.env_lm import ensure_env_lm, parse_tiny_path
from .models.smollm2 import resolve_model_path
from .rollout import RolloutSettings

WARM_START = "warm_start"  # run-folder entry: the warm-started actor, the KL reference when KL is on


# ----------------------------------------------------------------------------- envs


def takes_split(env_id: str) -> bool:
    """Whether the env has a ``split`` (its constructor names the parameter, or its registration sets it)."""
    spec = env_spec(env_id)
    if "split" in (spec.kwargs or {}):
        return True
    creator = spec.entry_point
    try:
        if isinstance(creator, str):
            creator = gym.envs.registration.load_env_creator(creator)
        return "split" in inspect.signature(creator).parameters
    except (ImportError, AttributeError, TypeError, ValueError):  # gym.make will say what is wrong
        return False


def make_envs(config: TrainConfig, split: str, count: int, pool: EnvPool | None = None) -> list[gym.Env]:
    """``count`` copies of the configured env on ``split`` (passed only to envs that have a split: README,
    the environment contract), built by ``pool`` (in its worker processes for a process pool) when given.
    Any failure to build one is a ConfigError that names the id and kwargs."""
    kwargs = env_kwargs(config.env)
    if takes_split(config.env.id):
        kwargs["split"] = split
    envs: list[gym.Env] = []
    try:
        for _ in range(count):
            envs.append((pool.make if pool is not None else gym.make)(config.env.id, **kwargs))
    except Exception as e:  # noqa: BLE001  (a wrong kwarg, missing data, an env bug: all stop the run here)
        for env in envs:
            env.close()
        raise ConfigError(f"cannot make env {config.env.id!r} with kwargs {kwargs}: {type(e).__name__}: {e}") from e
    return envs


# ----------------------------------------------------------------------------- model and optimizers


def model_folder(config: TrainConfig) -> str:
    """``model.path`` as a local folder: ``tiny[:<preset>[:<episodes>]]`` is a tiny LM fitted to the run's env,
    built once (``capo_train.models.env_lm``); ``smollm2`` the packaged SmolLM2; anything else a folder."""
    try:
        tiny = parse_tiny_path(config.model.path)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if tiny is None:
        return resolve_model_path(config.model.path)
    preset, episodes = tiny
    return str(ensure_env_lm(config.env.id, env_kwargs(config.env),
                             lambda: make_envs(config, config.env.train_split, 1)[0], preset=preset, episodes=episodes))


def build_model(config: TrainConfig, algo: BoundAlgorithm) -> tuple[ActorCritic, Any]:
    """The actor (with LoRA if ``model.lora``) and, if the algorithm needs one, its critic; and the tokenizer."""
    lora = None
    if config.model.lora:
        lora = LoraSettings(r=config.model.lora_r, alpha=config.model.lora_alpha, last_layers=config.model.lora_last_layers)
    return build_actor_critic(
        model_folder(config),
        critic=config.model.critic if algo.needs_critic else None,
        dtype=getattr(torch, config.model.dtype),
        lora=lora,
        gradient_checkpointing=config.model.gradient_checkpointing,
    )


def make_optimizers(model: ActorCritic, config: TrainConfig) -> dict[str, torch.optim.Optimizer]:
    """AdamW for the actor's trainable parameters and, when there is a critic, for the critic's."""
    if config.optim.actor_lr is None:  # auto, by model kind; written into the config, so the checkpoint keeps it
        config.optim.actor_lr = default_actor_lr(model.uses_lora, sum(p.numel() for p in model.actor.parameters()))
    opts = {
        "actor": torch.optim.AdamW(
            list(model.actor_parameters()), lr=config.optim.actor_lr, weight_decay=config.optim.weight_decay
        )
    }
    critic_params = list(model.critic_parameters())
    if critic_params:
        opts["critic"] = torch.optim.AdamW(critic_params, lr=config.optim.critic_lr, weight_decay=config.optim.weight_decay)
    return opts


# ----------------------------------------------------------------------------- the KL reference


def load_kl_reference(path: str | Path, config: TrainConfig, device) -> torch.nn.Module:
    """A frozen copy of the actor at ``path``, the KL term's reference policy."""
    return load_reference(path, dtype=getattr(torch, config.model.dtype)).to(device)


def initial_reference(config: TrainConfig, algo: BoundAlgorithm, model: ActorCritic, resumed: bool,
                      device) -> torch.nn.Module | None:
    """The KL reference a run starts (or resumes) with: None without a KL term, or with LoRA (the actor with
    its adapters off is the reference); a resumed run that had warm-started uses that warm start; otherwise
    the base checkpoint. A fresh run ignores a ``warm_start/`` left in ``out_dir`` by an earlier run."""
    warm_start = Path(config.out_dir) / WARM_START
    if algo.kl_coef > 0 and resumed and warm_start.is_dir():
        return load_kl_reference(warm_start, config, device)
    if algo.kl_coef > 0 and not model.uses_lora:
        return load_kl_reference(model.meta["base"], config, device)
    return None


def freeze_warm_start(model: ActorCritic, tokenizer, path: Path) -> None:
    """Write the warm-started actor (LoRA merged) to ``path`` as a plain HF folder, atomically: the KL
    reference of the RL that follows, and of a resumed run (a frozen copy of the actor at iteration 0;
    with LoRA, disabling the adapters would give the model from before the warm start instead)."""
    actor = copy.deepcopy(model.actor)
    actor = actor.merge_and_unload() if model.uses_lora else actor
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    actor.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


# ----------------------------------------------------------------------------- the run


@dataclass(kw_only=True)
class Run:
    """What one training run holds on to between iterations."""

    config: TrainConfig
    model: ActorCritic
    tokenizer: Any
    optimizers: dict
    algo: BoundAlgorithm  # the algorithm with its hyperparameters
    rollout: RolloutSettings  # how episodes are played
    reference: torch.nn.Module | None  # a frozen initial actor; None with LoRA (adapters off) or no KL
    accelerator: Any = None
    trainable: torch.nn.Module | None = None  # ``model`` as the accelerator prepared it (DDP-wrapped on >1 process)
    task_pool: list[str] | None = None  # the train tasks RL draws from (None: all; see sft.tasks)
    env_pool: EnvPool | None = None  # where env calls run (rollout.env_pool; None: serially, in this thread)
    # A rollout backend with its own copy of the weights (vLLM), kept across iterations; None for hf.
    vllm_backend: GenerationBackend | None = None
