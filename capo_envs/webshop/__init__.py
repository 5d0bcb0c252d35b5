"""The webshop domain: WebShop (Yao et al., 2022), buying the product an instruction describes.

``capo/WebShop-v0`` runs on the original's prepared catalogue and goals (``env.py``: ``ShopEnv``,
``make_webshop_env``); ``capo/SynthShop-v0`` (``synth.py``) on a catalogue generated in WebShop's schema
(``world.py``). Both use the same page engine (``engine.py``), the original's reward (``reward.py``) and its
text actions (``protocol.py``); ``server.py`` serves the pages over HTTP. docs/envs/webshop.md has the
contract, the data and the measurements.

``CARDS`` lists the ids this package registers (read by ``capo_envs/__init__.py``); keep this module free
of heavy imports: ``import capo_envs`` imports it.
"""

from .cards import CARDS

__all__ = ["CARDS"]
