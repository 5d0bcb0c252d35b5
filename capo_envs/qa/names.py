"""Invented, pronounceable names for SynthHop entities.

Every entity name holds exactly one *core word*: a word built from a syllable grammar, used by no other
name, that is neither a substring of any other word used in names nor contains another core word. That
one rule buys two guarantees the environment relies on:

* no entity name is a substring of another: a name's core word, having no spaces, would have to sit
  inside a single word of the other name, and the rule forbids that;
* a BM25 query made of an entity's name always holds one rare term that appears only in that entity's
  own passage and in the few passages that mention it.

The grammar's syllables and endings avoid English inflections (-s, -ed, -ing, -ly), so a stemmer does
not fold two core words into one term.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Sequence, TypeVar

T = TypeVar("T")

MIN_CORE_LEN = 6  # core words are at least this long; shorter substrings are never compared
MAX_CORE_LEN = 12
MIDDLE_SYLLABLE_SHARE = 0.5  # two-syllable names run out in the large preset; three-syllable ones do not
MAX_TRIES = 1_000  # draws before giving up on one core word (never reached at the presets' sizes)

_ONSETS = (
    "b", "bl", "br", "d", "dr", "f", "fr", "g", "gr", "h", "j", "k", "kl", "kr", "l", "m", "n",
    "p", "pr", "r", "s", "sh", "st", "t", "tr", "th", "v", "vr", "w", "z",
)  # fmt: skip
_VOWELS = ("a", "a", "e", "e", "i", "o", "o", "u", "ae", "ei", "ou")
_CLOSED_CODAS = ("l", "m", "n", "r", "k", "rn", "nd", "th", "st")  # before a vowel, so no vowel pile-ups
_OPEN_CODAS = ("", "", "l", "n", "r")  # before a consonant, so no cluster of three
_VOWEL_LETTERS = "aeiouy"

# The last syllable of a core word marks its kind, the way real place names and surnames do.
ENDINGS: dict[str, tuple[str, ...]] = {
    "person": ("mar", "dorn", "vik", "hal", "rud", "bek", "lund", "ov", "ard", "ath", "orn", "ek", "sen", "ley",
               "mond", "rik", "wald", "ani"),
    "city": ("holm", "stad", "mora", "gard", "wyn", "port", "rell", "vik", "akar", "um", "burg", "dal", "hafen",
             "ona", "ovo"),
    "country": ("ia", "ara", "and", "onia", "esh", "avia", "urn", "ostan", "eria", "ador"),
    "river": ("el", "wa", "ra", "ent", "ou", "ada", "isk"),
    "company": ("tek", "ora", "ex", "on", "ax", "ar", "ix", "um", "vo", "ant"),
    "university": ("ford", "mere", "worth", "ham", "ton", "bridge"),
    "film": ("ar", "en", "ow", "ith", "ael", "yn", "or", "am", "mere", "wick", "ora", "ell"),
    "album": ("ar", "en", "ow", "ith", "ael", "yn", "or", "am", "ra", "lo", "ette", "ine"),
    "band": ("ar", "en", "ow", "ith", "ael", "yn", "or", "am", "ko", "zan", "ix", "ola"),
}  # fmt: skip
_GIVEN_ENDINGS = ("a", "o", "en", "ir", "an", "ia", "el", "ik", "un")


@dataclass(frozen=True)
class Core:
    word: str  # capitalised, e.g. "Vellmoor"
    first_syllable: str  # lower case; a twin's core word starts with the same syllable


def pick(rng: random.Random, options: Sequence[T]) -> T:
    """``rng.choice`` at a third of the cost (one ``random()`` instead of rejection sampling on bits).

    The large preset makes millions of draws; this keeps it well inside its time budget and, like
    everything here, depends on the seed only.
    """
    return options[int(rng.random() * len(options))]


def between(rng: random.Random, lo: int, hi: int) -> int:
    """``rng.randint(lo, hi)`` at a third of the cost (see ``pick``)."""
    return lo + int(rng.random() * (hi - lo + 1))


def _syllable(rng: random.Random, before_vowel: bool) -> str:
    """Consonant onset, vowel, coda; the coda depends on whether the next piece starts with a vowel."""
    return pick(rng, _ONSETS) + pick(rng, _VOWELS) + pick(rng, _CLOSED_CODAS if before_vowel else _OPEN_CODAS)


def invent_given_names(rng: random.Random, count: int) -> list[str]:
    """A pool of distinct first names; people share them, as real people do, which makes queries harder."""
    names: dict[str, None] = {}
    while len(names) < count:
        ending = pick(rng, _GIVEN_ENDINGS)
        word = _syllable(rng, ending[0] in _VOWEL_LETTERS) + ending
        if 3 <= len(word) <= 7:
            names[word.capitalize()] = None
    return list(names)


class NameRegistry:
    """Hands out core words under the substring rule of the module docstring.

    ``_covered`` holds every substring (at least ``MIN_CORE_LEN`` long) of every word handed out or
    declared shared, so "is the candidate inside an existing word" is one set look-up; "does the candidate
    contain an existing core word" enumerates the candidate's own few substrings.
    """

    def __init__(self, rng: random.Random, shared_words: Iterable[str]):
        self._rng = rng
        self._cores: set[str] = set()
        self._covered: set[str] = set()
        for word in shared_words:
            self._cover(word.lower())

    def _cover(self, word: str) -> None:
        covered, n = self._covered, len(word)
        for i in range(n - MIN_CORE_LEN + 1):
            for j in range(i + MIN_CORE_LEN, n + 1):
                covered.add(word[i:j])

    def _admissible(self, word: str) -> bool:
        n = len(word)
        if not MIN_CORE_LEN <= n <= MAX_CORE_LEN or word in self._covered:
            return False
        cores = self._cores
        for i in range(n - MIN_CORE_LEN + 1):
            for j in range(i + MIN_CORE_LEN, n + 1):
                if word[i:j] in cores:
                    return False
        return True

    def core(self, kind: str, first_syllable: str | None = None) -> Core:
        """A fresh core word for an entity of ``kind``; with ``first_syllable``, a look-alike of another name."""
        rng = self._rng
        for _ in range(MAX_TRIES):
            ending = pick(rng, ENDINGS[kind])
            ending_is_vowel = ending[0] in _VOWEL_LETTERS
            middle = _syllable(rng, ending_is_vowel) if rng.random() < MIDDLE_SYLLABLE_SHARE else ""
            # syllables start with a consonant, so only the ending can start with a vowel
            first = first_syllable or _syllable(rng, ending_is_vowel and not middle)
            word = first + middle + ending
            if self._admissible(word):
                self._cores.add(word)
                self._cover(word)
                return Core(word.capitalize(), first)
        raise RuntimeError(f"could not invent a new {kind} name after {MAX_TRIES} tries")
