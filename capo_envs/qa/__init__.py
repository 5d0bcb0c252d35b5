"""The qa domain: multi-hop question answering by searching a corpus.

``capo/HotpotQA-v0``, ``capo/2WikiMultihopQA-v0`` and ``capo/MuSiQue-v0`` search each benchmark's prepared
corpus (``env.py``: ``MultiHopQAEnv``, ``make_qa_env``); ``capo/SynthHop-v0`` (``synth.py``) searches a
generated encyclopedia of fictional entities (``world.py``, with ``entities.py``, ``names.py`` and
``questions.py``).

``CARDS`` lists the ids this package registers (read by ``capo_envs/__init__.py``); keep this module free
of heavy imports: ``import capo_envs`` imports it.
"""

from .cards import CARDS

__all__ = ["CARDS"]
