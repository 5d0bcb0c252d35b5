"""The ids the alfworld domain registers: the released ALFWorld games and generated households."""

from __future__ import annotations

from ..core.paths import is_prepared
from ..core.registry import EnvCard
from .engine import engine_available

_ACTIONS = "<action>command</action> (one admissible command), or <tool_call> env_step with action_format='tool_call'"
_REWARD = "1 on the step that wins the game (win_reward=10: verl-agent's), else 0; non-admissible commands: 'Nothing happens.'"
_METRICS = "success, nonadmissible"

CARDS: tuple[EnvCard, ...] = (
    EnvCard(
        id="capo/ALFWorld-v0",
        entry_point="capo_envs.alfworld.env:ALFWorldEnv",
        summary="ALFWorld's household text games (6 task types; train 3,553 / valid_seen 140 / valid_unseen 134) on the real engine",
        data="ALFWorld's release (json_2.1.1 games + logic/) and the engine extra: pip install 'capo-gym[alfworld]'",
        prepare="capo data prepare alfworld",
        # Both the games and the engine: without either, gym.make fails, so offline tests must skip the id.
        data_ready=lambda: is_prepared("alfworld") and engine_available(),
        action_format=_ACTIONS,
        reward=_REWARD,
        metrics=_METRICS,
    ),
    EnvCard(
        id="capo/SynthHouse-v0",
        entry_point="capo_envs.alfworld.synth:SynthHouseEnv",
        cpu_preset={"size": "tiny", "max_steps": 20},
        cpu_preset_why="the smallest house and 20 steps (the CAPO authors' budget); long episodes overflow 1024 "
                       "prompt tokens with the whole history: train with rollout.state=window rollout.layout=per_action",
        summary="generated ALFWorld households (all 6 task types, size=micro|tiny|small|medium|large) played by the real ALFWorld engine",
        data="none (generated from a seed); needs the engine extra: pip install 'capo-gym[alfworld]'",
        prepare="pip install 'capo-gym[alfworld]'",
        data_ready=engine_available,
        action_format=_ACTIONS,
        reward=_REWARD,
        metrics=_METRICS,
    ),
)
