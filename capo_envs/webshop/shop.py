"""A shop: products by ASIN, their fixed prices, BM25 search over the original's indexed text, and goals.

Search follows WebShop's engine (``get_top_n_product_from_keywords``): the keywords are joined by spaces and
the top ``SEARCH_RETURN_N`` = 50 hits are kept, in rank order, dropping ASINs that are not loaded. The
ranking runs through capo_envs.retrieval (``bm25`` by default, Java-free; ``lucene`` is pyserini like the
original). The original's special keyword prefixes (``<r>``, ``<c>``, ``<q>``, ``<a>``) are not supported.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from ..retrieval import Passage, Retriever, open_retriever
from .products import search_text

SEARCH_RETURN_N = 50


class ProductStore:
    """Products by ASIN (``load_products`` layout) and their prices."""

    def get(self, asin: str) -> dict | None:
        raise NotImplementedError

    def price(self, asin: str) -> float:
        raise NotImplementedError

    def close(self) -> None:
        pass


class MemoryStore(ProductStore):
    def __init__(self, products: Iterable[Mapping], prices: Mapping[str, float]):
        self._products = {p["asin"]: dict(p) for p in products}
        self._prices = dict(prices)

    def get(self, asin: str) -> dict | None:
        return self._products.get(asin)

    def price(self, asin: str) -> float:
        return self._prices[asin]

    def __len__(self) -> int:
        return len(self._products)


class SqliteStore(ProductStore):
    """Products kept on disk (the full catalogue has 1.18M): one row per ASIN with its JSON and price.

    A connection per thread: ``AsyncVectorEnv`` workers are processes, but a server may use threads."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no product store at {self.path}")
        self._local = threading.local()

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        return db

    def get(self, asin: str) -> dict | None:
        row = self._db().execute("SELECT product FROM products WHERE asin = ?", (asin,)).fetchone()
        return json.loads(row[0]) if row else None

    def price(self, asin: str) -> float:
        row = self._db().execute("SELECT price FROM products WHERE asin = ?", (asin,)).fetchone()
        if row is None:
            raise KeyError(asin)
        return float(row[0])

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    @staticmethod
    def write(path: str | Path, products: Iterable[Mapping], prices: Mapping[str, float]) -> int:
        path = Path(path)
        path.unlink(missing_ok=True)
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE products (asin TEXT PRIMARY KEY, price REAL NOT NULL, product TEXT NOT NULL)")
        count = 0
        rows = ((p["asin"], prices[p["asin"]], json.dumps(p, ensure_ascii=False)) for p in products)
        batch: list[tuple] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= 10_000:
                db.executemany("INSERT INTO products VALUES (?, ?, ?)", batch)
                count += len(batch)
                batch.clear()
        db.executemany("INSERT INTO products VALUES (?, ?, ?)", batch)
        count += len(batch)
        db.commit()
        db.close()
        return count


def product_passages(products: Iterable[Mapping]) -> list[Passage]:
    """One passage per product: id = ASIN, text = what the original indexes (see ``search_text``)."""
    return [Passage(p["asin"], "", search_text(p)) for p in products]


class ProductSearch:
    """Top-50 ASINs for a keyword string."""

    def __init__(self, retriever: Retriever):
        self.retriever = retriever

    @classmethod
    def build(
        cls, products: Sequence[Mapping], kind: str = "bm25", index_dir: str | Path | None = None, **kwargs
    ) -> "ProductSearch":
        return cls(open_retriever(kind, passages=product_passages(products), index_dir=index_dir, **kwargs))

    @classmethod
    def load(cls, index_dir: str | Path, kind: str = "bm25", **kwargs) -> "ProductSearch":
        return cls(open_retriever(kind, index_dir=index_dir, **kwargs))

    def search(self, keywords: Sequence[str], k: int = SEARCH_RETURN_N) -> list[str]:
        query = " ".join(keywords)
        if not query.strip():
            return []
        return [hit.id for hit in self.retriever.search([query], k)[0]]

    def close(self) -> None:
        self.retriever.close()
