"""Read the official HotpotQA, 2WikiMultihopQA and MuSiQue release files into tasks and passages.

Only the official schemas are read (no Hugging Face re-encodings), so a file downloaded by
``capo data prepare`` is used exactly as its authors published it. Torch-free: the env imports this.

Each context paragraph of every question is a passage; the retrieval corpus of a dataset is their
de-duplicated union (what CAPO searches), built by :func:`passages_from_files`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ..core.paths import DataNotPreparedError, data_dir as default_data_dir
from ..retrieval.base import Passage
from .task import QATask

SPLITS = ("train", "dev")


# --- reading records ---------------------------------------------------------------------------


def iter_records(path: str | Path) -> Iterator[dict]:
    """Yield the records of a JSON array file or a JSONL file (decided by the first character).

    MuSiQue is released as JSONL, but copies of it (like the shared samples) are often JSON arrays.
    """
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        head = f.read(1)
        while head and head.isspace():
            head = f.read(1)
        f.seek(0)
        if head == "[":
            try:
                records = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
            yield from records
            return
        for line_no, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None


class _Record:
    """Typed field access that names the file, record index and field in every error."""

    def __init__(self, record: Any, path: Path, index: int):
        self.where = f"{path}: record {index}"
        if not isinstance(record, dict):
            raise ValueError(f"{self.where}: expected a JSON object, got {type(record).__name__}")
        self.record = record

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if name not in self.record:
            if default is ...:
                raise ValueError(f"{self.where}: missing field {name!r}")
            return default
        value = self.record[name]
        if not isinstance(value, kind):
            raise ValueError(f"{self.where}: field {name!r} has type {type(value).__name__}")
        return value

    def error(self, name: str, message: str) -> ValueError:
        return ValueError(f"{self.where}: field {name!r}: {message}")


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


# --- HotpotQA and 2WikiMultihopQA (the same layout) ----------------------------------------------


def _context(rec: _Record) -> list[tuple[str, list[str]]]:
    paragraphs = []
    for k, item in enumerate(rec.get("context", list)):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], list) and all(isinstance(s, str) for s in item[1])):
            raise rec.error("context", f"item {k} is not [title, [sentence, ...]]")
        paragraphs.append((item[0], item[1]))
    return paragraphs


def _supporting_titles(rec: _Record) -> tuple[str, ...]:
    titles = []
    for k, fact in enumerate(rec.get("supporting_facts", list)):
        if not (isinstance(fact, list) and len(fact) == 2 and isinstance(fact[0], str)):
            raise rec.error("supporting_facts", f"item {k} is not [title, sent_id]")
        titles.append(fact[0])
    return _unique(titles)


def _hotpot_like_task(rec: _Record, aliases: tuple[str, ...] = ()) -> QATask:
    titles = _supporting_titles(rec)
    answer = rec.get("answer", str)
    return QATask(
        id=rec.get("_id", str),
        question=rec.get("question", str),
        answers=_unique((answer, *aliases)),
        kind=rec.get("type", str, ""),
        supporting_titles=titles,
        expert_queries=titles,
    )


def load_hotpotqa(path: str | Path) -> list[QATask]:
    """Official HotpotQA JSON (``hotpot_train_v1.1.json``, ``hotpot_dev_distractor_v1.json``)."""
    path = Path(path)
    return [_hotpot_like_task(_Record(r, path, i)) for i, r in enumerate(iter_records(path))]


def hotpotqa_passages(path: str | Path) -> Iterator[Passage]:
    """Context paragraphs; sentences are joined with "" since HotpotQA keeps each leading space.

    A HotpotQA sentence without a leading space continues the previous one (a split inside a quote).
    """
    path = Path(path)
    for i, r in enumerate(iter_records(path)):
        rec = _Record(r, path, i)
        for k, (title, sentences) in enumerate(_context(rec)):
            yield Passage(f"{rec.record.get('_id')}/{k}", title, "".join(sentences).strip())


def read_2wiki_aliases(path: str | Path) -> dict[str, tuple[str, ...]]:
    """``id_aliases.json``: JSONL ``{"Q_id", "aliases", "demonyms"}``, the official evaluator's aliases."""
    aliases = {}
    for i, r in enumerate(iter_records(path)):
        rec = _Record(r, Path(path), i)
        aliases[rec.get("Q_id", str)] = tuple(rec.get("aliases", list, [])) + tuple(rec.get("demonyms", list, []))
    return aliases


def load_2wiki(path: str | Path, aliases_path: str | Path | None = None) -> list[QATask]:
    """Official 2WikiMultihopQA JSON (``train.json``, ``dev.json``).

    Answers get the aliases the official evaluator accepts: those of ``answer_id`` in
    ``id_aliases.json`` (``aliases_path``, else that file next to ``path`` when present), plus an
    ``answer_aliases`` list if a record carries one.
    """
    path = Path(path)
    if aliases_path is None and (path.parent / "id_aliases.json").exists():
        aliases_path = path.parent / "id_aliases.json"
    by_qid = read_2wiki_aliases(aliases_path) if aliases_path is not None else {}
    tasks = []
    for i, r in enumerate(iter_records(path)):
        rec = _Record(r, path, i)
        answer_id = rec.get("answer_id", (str, type(None)), None)
        aliases = tuple(rec.get("answer_aliases", list, [])) + by_qid.get(answer_id or "", ())
        tasks.append(_hotpot_like_task(rec, aliases))
    return tasks


def twowiki_passages(path: str | Path) -> Iterator[Passage]:
    """Context paragraphs; 2Wiki sentences carry no surrounding spaces, so they are joined with " "."""
    path = Path(path)
    for i, r in enumerate(iter_records(path)):
        rec = _Record(r, path, i)
        for k, (title, sentences) in enumerate(_context(rec)):
            yield Passage(f"{rec.record.get('_id')}/{k}", title, " ".join(s.strip() for s in sentences).strip())


# --- MuSiQue ---------------------------------------------------------------------------------------


def _musique_paragraphs(rec: _Record) -> dict[int, tuple[str, str]]:
    paragraphs = {}
    for k, p in enumerate(rec.get("paragraphs", list)):
        if not (isinstance(p, dict) and isinstance(p.get("idx"), int) and isinstance(p.get("title"), str)
                and isinstance(p.get("paragraph_text"), str)):
            raise rec.error("paragraphs", f"item {k} needs int idx, str title and str paragraph_text")
        paragraphs[p["idx"]] = (p["title"], p["paragraph_text"])
    return paragraphs


def _musique_task(rec: _Record) -> QATask:
    paragraphs = _musique_paragraphs(rec)
    hop_titles = []
    for k, hop in enumerate(rec.get("question_decomposition", list)):
        if not isinstance(hop, dict):
            raise rec.error("question_decomposition", f"hop {k} is not an object")
        idx = hop.get("paragraph_support_idx")
        if idx is None:
            continue  # unanswerable twins (MuSiQue-Full) have hops without support
        if idx not in paragraphs:
            raise rec.error("question_decomposition", f"hop {k} points to paragraph {idx!r}, which is absent")
        hop_titles.append(paragraphs[idx][0])
    qid = rec.get("id", str)
    titles = _unique(hop_titles)
    return QATask(
        id=qid,
        question=rec.get("question", str),
        answers=_unique((rec.get("answer", str), *rec.get("answer_aliases", list, []))),
        kind=qid.split("__", 1)[0] if "__" in qid else "",
        supporting_titles=titles,
        expert_queries=titles,
    )


def load_musique(path: str | Path, include_unanswerable: bool = False) -> list[QATask]:
    """Official MuSiQue JSONL (``musique_ans_v1.0_{train,dev}.jsonl``) or a JSON array of its records.

    Records with ``answerable: false`` have no gold answer path, so they are skipped by default.
    """
    path = Path(path)
    tasks = []
    for i, r in enumerate(iter_records(path)):
        rec = _Record(r, path, i)
        if include_unanswerable or rec.get("answerable", bool, True):
            tasks.append(_musique_task(rec))
    return tasks


def musique_passages(path: str | Path) -> Iterator[Passage]:
    path = Path(path)
    for i, r in enumerate(iter_records(path)):
        rec = _Record(r, path, i)
        for idx, (title, text) in _musique_paragraphs(rec).items():
            yield Passage(f"{rec.record.get('id')}/{idx}", title, text.strip())


# --- de-duplication --------------------------------------------------------------------------------


def passage_key(title: str, text: str) -> bytes:
    """A 16-byte digest of (title, whitespace-normalised text): a set of these fits millions of passages."""
    normalised = " ".join(title.split()) + "\0" + " ".join(text.split())
    return hashlib.blake2b(normalised.encode("utf-8"), digest_size=16).digest()


def dedup_passages(passages: Iterable[Passage]) -> Iterator[Passage]:
    """The first occurrence of each (title, text), renumbered "0", "1", ... in first-seen order.

    Empty paragraphs are dropped: they can never be a useful search result.
    """
    seen: set[bytes] = set()
    for p in passages:
        if not p.text.strip():
            continue
        key = passage_key(p.title, p.text)
        if key not in seen:
            seen.add(key)
            yield Passage(str(len(seen) - 1), p.title, p.text)


# --- the registry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QADatasetSpec:
    name: str
    files: dict[str, str]  # split -> official file name, as found in <data_dir>/<name>/raw/
    load: Callable[[Path], list[QATask]]
    passages: Callable[[Path], Iterator[Passage]]
    optional_files: tuple[str, ...] = ()  # read when present (2Wiki's answer aliases)


QA_DATASETS: dict[str, QADatasetSpec] = {
    "hotpotqa": QADatasetSpec(
        "hotpotqa",
        {"train": "hotpot_train_v1.1.json", "dev": "hotpot_dev_distractor_v1.json"},
        load_hotpotqa,
        hotpotqa_passages,
    ),
    "2wiki": QADatasetSpec(
        "2wiki", {"train": "train.json", "dev": "dev.json"}, load_2wiki, twowiki_passages, ("id_aliases.json",)
    ),
    "musique": QADatasetSpec(
        "musique",
        {"train": "musique_ans_v1.0_train.jsonl", "dev": "musique_ans_v1.0_dev.jsonl"},
        load_musique,
        musique_passages,
    ),
}


def spec(name: str) -> QADatasetSpec:
    if name not in QA_DATASETS:
        raise KeyError(f"unknown QA dataset {name!r}; known: {', '.join(QA_DATASETS)}")
    return QA_DATASETS[name]


def raw_path(name: str, split: str, data_dir: str | Path | None = None) -> Path:
    """Where ``capo data prepare`` puts the official file of a split."""
    files = spec(name).files
    if split not in files:
        raise KeyError(f"{name} has no split {split!r}; splits: {', '.join(files)}")
    return Path(data_dir or default_data_dir()) / name / "raw" / files[split]


def load_split(name: str, split: str, data_dir: str | Path | None = None) -> list[QATask]:
    path = raw_path(name, split, data_dir)
    if not path.exists():
        raise DataNotPreparedError(f"{name} {split} is not prepared (missing {path}). Run: capo data prepare {name}")
    return spec(name).load(path)


def passages_from_files(name: str, paths: Iterable[str | Path]) -> Iterator[Passage]:
    """The de-duplicated union of the context paragraphs of several files of one dataset."""
    read = spec(name).passages
    return dedup_passages(chain.from_iterable(read(Path(p)) for p in paths))
