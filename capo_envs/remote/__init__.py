"""Envs across a process or machine boundary: ``server.py`` serves any Gymnasium text env in OpenEnv's protocol
(``capo serve env ID``; OpenEnv's clients work unchanged), ``env.py`` is ``capo/Remote-v0``, a
Gymnasium env that plays a served one, ``client.py`` holds the blocking and asyncio session clients,
``protocol.py`` the served env's action protocol as a remote env publishes it, and ``ws.py`` the WebSocket
framing (standard library only). docs/env_server.md has the protocol and the load test.

``CARDS`` lists the ids this package registers (read by ``capo_envs/__init__.py``); keep this module free
of heavy imports: ``import capo_envs`` imports it.
"""

from .cards import CARDS

__all__ = ["CARDS"]
