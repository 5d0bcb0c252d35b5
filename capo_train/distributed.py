"""What changes when the trainer runs as several processes (``accelerate launch`` / ``torchrun``, one per
device): the accelerator, and agreeing on what every process must do the same number of times.

With one process (the CPU default) every helper here returns its input unchanged."""

from __future__ import annotations

import math

import torch

from .config import TrainConfig
from .models.actor_critic import ActorCritic
from .rows import Trajectory


def make_accelerator(config: TrainConfig):
    """One process on the CPU here; under ``accelerate launch`` / ``torchrun`` one process per device, each
    collecting its own episodes, with gradients averaged across processes (DDP)."""
    from accelerate import Accelerator, DistributedDataParallelKwargs

    # The actor pass leaves a separate critic unused and vice versa.
    ddp = DistributedDataParallelKwargs(find_unused_parameters=True)
    return Accelerator(cpu=config.device == "cpu" or not torch.cuda.is_available(), kwargs_handlers=[ddp])


def unwrap(model: torch.nn.Module) -> ActorCritic:
    """The ``ActorCritic`` inside a DDP wrapper (its attributes are not reachable through the wrapper)."""
    return getattr(model, "module", model)


def gather_trajectories(trajectories: list[Trajectory], accelerator) -> list[Trajectory]:
    """Every process's trajectories, for statistics that describe the whole batch."""
    if accelerator is None or accelerator.num_processes == 1:
        return trajectories
    from dataclasses import replace

    from accelerate.utils import gather_object

    # Without the hidden states a rollout recorded (state_features, frozen_states, final_features): the
    # statistics never read them, and frozen_states hold [tokens, H] per episode, too much to ship for that.
    light = [replace(t, actions=[replace(a, state_features=None, frozen_states=None) for a in t.actions],
                     final_features=None) for t in trajectories]
    return gather_object(light)


def synced_minibatch_count(rows: int, size: int, accelerator) -> int | None:
    """With several processes, every one must take the same number of optimizer steps: the most any needs."""
    if accelerator is None or accelerator.num_processes == 1:
        return None
    count = torch.tensor([math.ceil(rows / size)], device=accelerator.device)
    return int(accelerator.gather(count).max())
