"""Selectors: how relevant a paper is to a query, as a score in [0, 1].

The CAPO authors' reward and evaluation both read a selector (PaSa's "does this paper satisfy the
query?" judge): the reward of a call is the sum of the top-3 scores of the papers it added, papers under
0.01 are dropped, and the evaluation ranks the pool by score. One interface covers every scorer:
``score(query, papers) -> [float]``.

* :class:`LexicalSelector` (the default; no model): the share of the query's content words a paper holds.
  Deterministic and instant, for tests, CPU runs and SynthScholar, whose gold papers share the query's
  words by construction; poorly calibrated on real queries.
* :class:`HFSelector`: any Hugging Face sequence classifier, or a causal LM read as a yes/no judge (PaSa's
  selector reads P("True") of the first generated token; Qwen3-Reranker reads P("yes")). Imported lazily:
  ``import capo_envs`` and the default env never import torch or transformers.
"""

from __future__ import annotations

import re
from typing import Any, Protocol, Sequence

from .db import STOP_WORDS, Paper

# Words of AutoScholarQuery's question templates ("Could you provide me some works that ...") that say
# nothing about the topic.
QUERY_BOILERPLATE = frozenset(
    """could can would please provide give list mention recommend show find tell me us some any works work
    papers paper studies study research researches articles article literature approaches approach methods
    method techniques technique propose proposed proposing use used using uses apply applying applied exploit
    exploiting explore exploring explored discuss discussing related relevant regarding concerning about
    investigate investigating focus focusing""".split()
)
_WORD = re.compile(r"\w+")
SELECTOR_PROMPT = (
    "You are an expert researcher. Decide whether the paper below fully satisfies the user's query.\n"
    "User query: {query}\nTitle: {title}\nAbstract: {abstract}\n"
    "Answer with True or False first, then give a reason.\nDecision:"
)


class Selector(Protocol):
    name: str

    def score(self, query: str, papers: Sequence[Paper]) -> list[float]:
        """One relevance score in [0, 1] per paper."""
        ...

    def close(self) -> None: ...


def _stem(word: str) -> str:
    """A light plural fold ("networks" -> "network"), enough for the lexical scorer."""
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def content_words(text: str) -> list[str]:
    words = []
    for word in _WORD.findall(text.lower()):
        if word in STOP_WORDS or word in QUERY_BOILERPLATE or not word.strip("_"):
            continue
        stem = _stem(word)
        if stem not in words:
            words.append(stem)
    return words


class LexicalSelector:
    """The share of the query's content words that occur in the paper: a word in the title counts 1, one
    only in the abstract ``abstract_weight``. Scores are cached per (query, paper id)."""

    name = "lexical"

    def __init__(self, abstract_weight: float = 0.8, cache_size: int = 200_000):
        self.abstract_weight = float(abstract_weight)
        self.cache_size = cache_size
        self._cache: dict[tuple[str, str], float] = {}
        self._query_words: dict[str, list[str]] = {}

    def score(self, query: str, papers: Sequence[Paper]) -> list[float]:
        words = self._query_words.get(query)
        if words is None:
            words = self._query_words[query] = content_words(query)
        out = []
        for paper in papers:
            key = (query, paper.arxiv_id)
            value = self._cache.get(key)
            if value is None:
                value = self._score(words, paper)
                if len(self._cache) >= self.cache_size:
                    self._cache.clear()
                self._cache[key] = value
            out.append(value)
        return out

    def _score(self, words: list[str], paper: Paper) -> float:
        if not words:
            return 0.0
        title = {_stem(w) for w in _WORD.findall(paper.title.lower())}
        abstract = {_stem(w) for w in _WORD.findall(paper.abstract.lower())}
        total = sum(1.0 if w in title else self.abstract_weight if w in abstract else 0.0 for w in words)
        return round(total / len(words), 6)

    def close(self) -> None:
        self._cache.clear()


class HFSelector:
    """A Hugging Face model as a selector (lazy imports: torch and transformers load on first use).

    ``kind="seq_cls"``: ``AutoModelForSequenceClassification``; the score is ``transform`` of its logits:
    ``"softmax_last"`` (P of the last class), ``"one_minus_softmax_last"`` (CAPO's ``1 - probs[-1]``, for a
    converted selector whose last class means "not relevant"), ``"sigmoid"`` (one logit, a cross-encoder).
    ``kind="yes_no"``: a causal LM read at the next token; the score is P(``yes_token``) against
    ``no_token`` (Qwen3-Reranker: "yes"/"no"), or against the whole vocabulary with ``full_vocab=True``
    (PaSa's selector: P("True") of the first generated token).
    """

    name = "hf"
    TRANSFORMS = ("softmax_last", "one_minus_softmax_last", "sigmoid")

    def __init__(
        self,
        model: str,
        *,
        kind: str = "seq_cls",
        transform: str = "softmax_last",
        yes_token: str = "True",
        no_token: str = "False",
        full_vocab: bool = False,
        prompt: str = SELECTOR_PROMPT,
        max_abstract_chars: int = 2_000,
        max_length: int = 1_024,
        batch_size: int = 8,
        device: str | None = None,
    ):
        if kind not in ("seq_cls", "yes_no"):
            raise ValueError(f"kind must be 'seq_cls' or 'yes_no', got {kind!r}")
        if transform not in self.TRANSFORMS:
            raise ValueError(f"transform must be one of {self.TRANSFORMS}, got {transform!r}")
        self.model_name, self.kind, self.transform = model, kind, transform
        self.yes_token, self.no_token, self.full_vocab = yes_token, no_token, full_vocab
        self.prompt, self.max_abstract_chars = prompt, max_abstract_chars
        self.max_length, self.batch_size, self.device = max_length, batch_size, device
        self._model: Any = None
        self._tokenizer: Any = None
        self._cache: dict[tuple[str, str], float] = {}

    def _load(self) -> None:
        import torch  # noqa: F401  (lazy: only a user of this selector pays for it)
        from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(self.model_name)
        if self._tokenizer.pad_token is None:
            self._tokenizer.pad_token = self._tokenizer.eos_token
        self._tokenizer.padding_side = "left"  # the yes/no judge reads the last position
        cls = AutoModelForSequenceClassification if self.kind == "seq_cls" else AutoModelForCausalLM
        self._model = cls.from_pretrained(self.model_name).eval()
        if self.device:
            self._model.to(self.device)
        if self.kind == "yes_no":
            self._yes = self._single_token(self.yes_token)
            self._no = self._single_token(self.no_token)

    def _single_token(self, text: str) -> int:
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{text!r} is {len(ids)} tokens for {self.model_name}; the judge needs one token")
        return ids[0]

    def score(self, query: str, papers: Sequence[Paper]) -> list[float]:
        missing = [p for p in papers if (query, p.arxiv_id) not in self._cache]
        if missing:
            if self._model is None:
                self._load()
            for start in range(0, len(missing), self.batch_size):
                batch = missing[start : start + self.batch_size]
                for paper, value in zip(batch, self._score_batch(query, batch)):
                    self._cache[(query, paper.arxiv_id)] = value
        return [self._cache[(query, p.arxiv_id)] for p in papers]

    def _score_batch(self, query: str, papers: Sequence[Paper]) -> list[float]:
        import torch

        texts = [self.prompt.format(query=query, title=p.title, abstract=p.abstract[: self.max_abstract_chars])
                 for p in papers]
        enc = self._tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length)
        enc = {k: v.to(self._model.device) for k, v in enc.items()}
        with torch.no_grad():
            logits = self._model(**enc).logits.float()
        if self.kind == "yes_no":
            last = logits[:, -1, :]
            if self.full_vocab:
                probs = torch.softmax(last, dim=-1)[:, self._yes]
            else:
                probs = torch.softmax(last[:, [self._yes, self._no]], dim=-1)[:, 0]
        elif self.transform == "sigmoid":
            probs = torch.sigmoid(logits[:, -1])
        else:
            probs = torch.softmax(logits, dim=-1)[:, -1]
            if self.transform == "one_minus_softmax_last":
                probs = 1.0 - probs
        return [float(min(1.0, max(0.0, v))) for v in probs.tolist()]

    def close(self) -> None:
        self._model = self._tokenizer = None
        self._cache.clear()


def make_selector(spec: Any = "lexical") -> Selector:
    """``"lexical"`` (or None), a selector object, ``"hf:<model>"``, or a dict of :class:`HFSelector`
    keyword arguments (``{"model": ..., "kind": "yes_no", ...}``)."""
    if spec is None or spec == "lexical":
        return LexicalSelector()
    if isinstance(spec, str) and spec.startswith("hf:"):
        return HFSelector(spec[3:])
    if isinstance(spec, dict):
        return HFSelector(**spec)
    if callable(getattr(spec, "score", None)):
        return spec
    raise ValueError(f"selector must be 'lexical', 'hf:<model>', a dict of HFSelector arguments or an object "
                     f"with score(query, papers); got {spec!r}")
