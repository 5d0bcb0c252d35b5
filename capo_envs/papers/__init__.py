"""The papers domain: academic paper search (PaSa / the CAPO authors' flow), building a pool of papers
with search and citation-expand calls.

``capo/PaperSearch-v0`` runs on PaSa's AutoScholarQuery / RealScholarQuery over a prepared arXiv database
(``env.py``: ``PaperSearchEnv``, ``make_papersearch_env``; ``db.py``); ``capo/SynthScholar-v0``
(``synth.py``) over a generated scholarly world with a citation graph (``world.py``, ``vocab.py``).
``protocol.py`` holds the multi-call action format, ``selector.py`` the relevance scorer, ``server.py`` a
Semantic Scholar-style HTTP API over a database. docs/envs/papers.md has the contract, the data and the
measurements.

``CARDS`` lists the ids this package registers (read by ``capo_envs/__init__.py``); keep this module free
of heavy imports: ``import capo_envs`` imports it.
"""

from .cards import CARDS

__all__ = ["CARDS"]
