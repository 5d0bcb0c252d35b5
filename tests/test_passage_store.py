"""The passages Lucene and PISA keep beside their indexes (``capo_envs.retrieval.passage_store``): written,
read back by position, and read ahead for a query's hits."""

from __future__ import annotations

import json
import os

import pytest

from capo_envs.retrieval import Passage
from capo_envs.retrieval.passage_store import PassageStore, PassageWriter

PASSAGES = [
    Passage("p0", "Paris", "Paris is the capital of France."),
    Passage("p1", "東京", "東京は日本の首都です。"),  # multi-byte: offsets are bytes, not characters
    Passage("p2", "", ""),
    Passage("p3", "Quotes \"and\" \\ slashes", "line\nbreak\ttab"),
]


@pytest.fixture()
def store(tmp_path):
    with PassageWriter(tmp_path) as writer:
        positions = [writer.add(p) for p in PASSAGES]
    assert positions == [0, 1, 2, 3] and writer.count == 4
    opened = PassageStore(tmp_path)
    yield opened
    opened.close()


def test_passages_come_back_by_position(store):
    assert len(store) == len(PASSAGES)
    assert [store.passage(i) for i in range(len(store))] == PASSAGES
    assert store.record(1) == {"id": "p1", "title": "東京", "text": "東京は日本の首都です。"}


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this platform")
def test_prefetch_asks_for_exactly_the_hits_bytes(store, monkeypatch):
    asked = []
    real_fadvise = os.posix_fadvise

    def recording_fadvise(fd, offset, length, advice):
        asked.append((offset, length, advice))
        return real_fadvise(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", recording_fadvise)
    store.prefetch(iter([3, 0, 3]))  # any iterable, repeats allowed
    assert [advice for *_, advice in asked] == [os.POSIX_FADV_WILLNEED] * 3
    with open(store._file.name, "rb") as raw:
        read = []
        for offset, length, _ in asked:
            raw.seek(offset)
            read.append(json.loads(raw.read(length)))
    assert [r["id"] for r in read] == ["p3", "p0", "p3"]  # each range is one whole passage, no more


def test_prefetch_on_an_empty_store_is_a_no_op(tmp_path):
    with PassageWriter(tmp_path):
        pass
    empty = PassageStore(tmp_path)
    assert len(empty) == 0
    empty.prefetch([])
    empty.close()
