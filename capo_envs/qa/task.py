"""One multi-hop question, whatever dataset it came from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QATask:
    id: str
    question: str
    answers: tuple[str, ...]  # the gold answer first, then aliases
    kind: str = ""  # bridge, comparison, compositional, 2hop, ...
    supporting_titles: tuple[str, ...] = ()  # titles of the gold passages, in hop order
    expert_queries: tuple[str, ...] = ()  # what the oracle searches, one query per hop
