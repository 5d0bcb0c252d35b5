"""The alfworld domain: the real ALFWorld games (``capo/ALFWorld-v0``) and generated ones
(``capo/SynthHouse-v0``), both played by ALFWorld's own engine (TextWorld's PDDL engine with Fast Downward)
in a child process per env. ``env.py`` holds the env (``HouseEnv``, ``ALFWorldEnv``), ``synth.py``
``SynthHouseEnv``, ``world.py`` the household generator, ``engine.py`` the client of the engine process
(``worker.py``), ``games.py`` the released games' index. docs/envs/alfworld.md has the contract, the data
and the measurements.

``CARDS`` lists the ids this package registers (read by ``capo_envs/__init__.py``); keep this module free
of heavy imports: ``import capo_envs`` imports it.
"""

from .cards import CARDS

__all__ = ["CARDS"]
