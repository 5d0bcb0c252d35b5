"""``capo/PaperSearch-v0``: paper search over a prepared database, on PaSa's real queries.

``capo data prepare papers`` writes ``$CAPO_DATA_DIR/papers/``: ``papers.sqlite`` (arXiv metadata and
citation edges, see ``db.py``), ``queries/AutoScholarQuery/{train,dev,test}.jsonl`` and
``queries/RealScholarQuery/test.jsonl`` (PaSa's files as released: ``question``, ``answer`` titles,
``answer_arxiv_id``, ``source_meta.published_time``, ``qid``), and ``manifest.json`` last.

Gold ids are normalised (a version suffix such as ``1803.00316v1`` is stripped, as the CAPO evaluation
does). Each query's ``published_time`` is its date cut-off: search and expand hide later papers
(``use_cutoff=False`` shows everything), as PaSa restricts its searches to before the source paper.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.paths import dataset_dir, require
from .db import PaperDB
from .env import PaperSearchEnv
from .ids import normalize_arxiv_id
from .world import PaperTask

DATASET = "papers"
DB_FILE = "papers.sqlite"
QUERY_FILES = {
    "train": "AutoScholarQuery/train.jsonl",
    "dev": "AutoScholarQuery/dev.jsonl",
    "test": "AutoScholarQuery/test.jsonl",
    "realscholar": "RealScholarQuery/test.jsonl",
}
PREPARE = "capo data prepare papers"


def _cutoff(published: Any) -> str | None:
    text = str(published or "")
    if len(text) == 8 and text.isdigit():
        return f"{text[:4]}-{text[4:6]}-{text[6:]}"
    return None


def load_queries(path: str | Path) -> list[PaperTask]:
    """PaSa's JSONL queries as tasks; a query whose gold ids are all unusable is skipped."""
    tasks = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            ids = row.get("answer_arxiv_id") or []
            titles = row.get("answer") or []
            gold, gold_titles = [], []
            for i, raw in enumerate(ids):
                arxiv_id = normalize_arxiv_id(raw)
                if arxiv_id and arxiv_id not in gold:
                    gold.append(arxiv_id)
                    gold_titles.append(" ".join(str(titles[i]).split()) if i < len(titles) else "")
            if not gold:
                continue
            tasks.append(PaperTask(
                id=str(row.get("qid") or f"{Path(path).stem}_{number}"),
                question=str(row["question"]),
                gold=tuple(gold),
                gold_titles=tuple(gold_titles),
                cutoff=_cutoff((row.get("source_meta") or {}).get("published_time")),
                search_phrases=(str(row["question"]),),
            ))
    return tasks


def make_papersearch_env(
    split: str = "dev",
    db: str | None = None,
    queries_dir: str | None = None,
    **env_kwargs: Any,
) -> PaperSearchEnv:
    """The env over the prepared database (or ``db``, any database ``build_database`` wrote), on the
    queries of ``split``: train, dev, test (AutoScholarQuery) or realscholar (RealScholarQuery)."""
    if split not in QUERY_FILES:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(QUERY_FILES)}")
    root = dataset_dir(DATASET)
    db_path = Path(db).expanduser() if db else require(root / DB_FILE, "the paper database", PREPARE)
    queries_root = Path(queries_dir).expanduser() if queries_dir else root / "queries"
    queries = require(queries_root / QUERY_FILES[split], f"the {split} queries", PREPARE)
    return PaperSearchEnv(PaperDB(db_path), load_queries(queries), **env_kwargs)
