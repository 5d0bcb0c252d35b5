"""The id the remote package registers: an env served elsewhere (``capo serve env``) played as a local one."""

from __future__ import annotations

from ..core.registry import EnvCard

CARDS: tuple[EnvCard, ...] = (
    EnvCard(
        id="capo/Remote-v0",
        entry_point="capo_envs.remote.env:RemoteEnv",
        summary="any env served by `capo serve env ID` (OpenEnv's protocol), played through a WebSocket session: "
                "url=, and optionally env_id=/kwargs= as the server serves them (checked); without url, env_id "
                "(default capo/SynthChain-v0) is served from a loopback server in this process",
        data="whatever the served env reads, on the server's machine",
        action_format="the served env's (its protocol is published as the server has it)",
        reward="the served env's",
        metrics="the served env's",
    ),
)
