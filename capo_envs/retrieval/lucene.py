"""BM25 through Lucene (pyserini's Anserini jar), the backend Search-R1's own BM25 numbers come from.

Optional: needs a JDK (11+; 17 works) and pyserini 0.22.1, the last release that runs on Java 17.
Only two Python packages are needed, not pyserini's long dependency list::

    pip install --no-deps pyserini==0.22.1 pyjnius

Indexing runs Anserini's ``IndexCollection`` in a ``java`` subprocess; searching uses its
``SimpleSearcher`` in-process through pyjnius (the JVM starts when the first index is opened). Lucene only indexes ``"title"\\ntext``; the passages
themselves live next to it in ``passages.jsonl`` (read through a memory map and an offsets array),
so a 21M-passage corpus costs no Python memory. Each passage's Lucene id is its zero-padded corpus
position: Anserini breaks exact score ties by that id, which makes ties fall in corpus order, and
maps a hit back to its passage without a lookup table.

Layout of an index directory::

    meta.json        {"retriever": "lucene", "num_passages": N, "anserini_jar": "..."}
    passages.jsonl   {"id", "title", "text"} per line, in corpus order
    offsets.npy      N + 1 byte offsets into passages.jsonl
    lucene/          the Lucene index
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any, Iterable, Sequence

from .base import Hit, Passage, check_search_args
from .passage_store import PassageStore, PassageWriter, StoredPassagesRetriever

INSTALL_HINT = "pip install --no-deps pyserini==0.22.1 pyjnius"
ID_WIDTH = 12  # zero-padded corpus positions, so that string order is corpus order


def anserini_jar() -> Path:
    """The Anserini fat jar shipped inside pyserini (or named by ``$ANSERINI_CLASSPATH``, like pyserini)."""
    folder = os.environ.get("ANSERINI_CLASSPATH")
    if folder is None:
        try:
            import pyserini
        except ImportError:
            raise ImportError(f"the lucene retriever needs pyserini: {INSTALL_HINT}") from None
        folder = str(Path(pyserini.__file__).parent / "resources" / "jars")
    jars = sorted(Path(folder).glob("anserini-*-fatjar.jar"))
    if not jars:
        raise ImportError(f"no anserini-*-fatjar.jar in {folder}; reinstall with: {INSTALL_HINT}")
    return jars[-1]


def java_home() -> Path:
    """``$JAVA_HOME``, else the JDK that the ``java`` on ``PATH`` belongs to."""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    if java is None:
        raise RuntimeError(
            "the lucene retriever needs Java 11+ (17 recommended): install a JDK "
            "(e.g. apt-get install openjdk-17-jdk-headless) or set JAVA_HOME"
        )
    return Path(java).resolve().parent.parent


def _autoclass(name: str) -> Any:
    """A Java class from the Anserini jar; starts the in-process JVM on first use."""
    os.environ.setdefault("JAVA_HOME", str(java_home()))  # pyjnius looks for libjvm there first
    jar = str(anserini_jar())
    try:
        import jnius_config
    except ImportError:
        raise ImportError(f"the lucene retriever needs pyjnius: {INSTALL_HINT}") from None
    # Not get_classpath(): it imports jnius, which starts the JVM. The jar path is the one
    # pyserini.pyclass adds, so either may come first.
    if not jnius_config.vm_running and jar not in (jnius_config.classpath or []):
        jnius_config.add_classpath(jar)
    import jnius  # starts the JVM

    try:
        return jnius.autoclass(name)
    except jnius.JavaException as e:
        raise RuntimeError(
            f"Java class {name} not found: the JVM was started (by importing jnius) before {jar} was put on "
            "its classpath; create the LuceneRetriever before anything else imports jnius"
        ) from e


def _detach_if_worker() -> None:
    """pyjnius attaches each calling thread to the JVM and only detaches them on Android; a server
    thread per request would leak one JVM thread each without this."""
    if threading.current_thread() is not threading.main_thread():
        import jnius

        jnius.detach()


class LuceneRetriever(StoredPassagesRetriever):
    def __init__(self, index_dir: str | Path, *, threads: int = 1, _owned_tmpdir: Path | None = None):
        """Open a saved index (see ``load``); ``threads`` is for ``batch_search`` over many queries."""
        self.index_dir = Path(index_dir)
        self.threads = threads
        self._owned_tmpdir = _owned_tmpdir  # a fresh build lives in a temp dir until saved
        meta = json.loads((self.index_dir / "meta.json").read_text())
        if meta.get("retriever") != "lucene":
            raise ValueError(f"{self.index_dir} is not a lucene index (meta.json says {meta.get('retriever')!r})")
        self.num_passages = int(meta["num_passages"])
        self._store = PassageStore(self.index_dir)
        # Anserini makes one clause per distinct query term; Lucene's default cap of 1024 would make
        # a long query raise, and a query costs no more than its length anyway.
        _autoclass("org.apache.lucene.search.IndexSearcher").setMaxClauseCount(2**31 - 1)
        self._searcher = _autoclass("io.anserini.search.SimpleSearcher")(str(self.index_dir / "lucene"))
        self._closed = False

    @classmethod
    def build(cls, passages: Iterable[Passage], *, threads: int = 1, show_progress: bool = False) -> "LuceneRetriever":
        """Index ``passages`` into a temp dir (removed on ``close`` unless ``save``d elsewhere first)."""
        tmp = Path(tempfile.mkdtemp(prefix="capo-lucene-"))
        try:
            index_dir, collection = tmp / "index", tmp / "collection"
            index_dir.mkdir()
            count = _write_collection(passages, index_dir, collection, max(1, threads))
            _run_indexer(collection, index_dir / "lucene", threads, show_progress)
            shutil.rmtree(collection)
            meta = {"retriever": "lucene", "num_passages": count, "anserini_jar": anserini_jar().name}
            (index_dir / "meta.json").write_text(json.dumps(meta) + "\n")
            return cls(index_dir, threads=threads, _owned_tmpdir=tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def load(cls, index_dir: str | Path, *, threads: int = 1) -> "LuceneRetriever":
        return cls(index_dir, threads=threads)

    def save(self, index_dir: str | Path) -> None:
        """Copy the index to ``index_dir``: staged next to it, then renamed into place, so a crash
        never leaves a half-written index there. Replaces what was there."""
        target = Path(index_dir).resolve()
        if target == self.index_dir.resolve():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
        shutil.copytree(self.index_dir, staging)
        if target.exists():
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(target, old)
            os.replace(staging, target)
            shutil.rmtree(old)
        else:
            os.replace(staging, target)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_search_args(queries, k)
        if self._closed:
            raise RuntimeError("search on a closed LuceneRetriever")
        if not queries:
            return []
        try:
            if len(queries) == 1:
                return self.hits([self._pairs(self._searcher.search(queries[0], k))])
            return self._batch_search(list(queries), k)
        finally:
            _detach_if_worker()

    def _batch_search(self, queries: list[str], k: int) -> list[list[Hit]]:
        jlist = _autoclass("java.util.ArrayList")
        query_list, id_list = jlist(), jlist()
        for i, q in enumerate(queries):
            query_list.add(q)
            id_list.add(str(i))
        found = self._searcher.batch_search(query_list, id_list, k, self.threads)
        return self.hits([self._pairs(found.get(str(i))) for i in range(len(queries))])

    @staticmethod
    def _pairs(results: Any) -> list[tuple[int, float]]:
        return [(int(result.docid), float(result.score)) for result in results or []]

    def _release(self) -> None:
        self._searcher.close()


def _write_collection(passages: Iterable[Passage], index_dir: Path, collection: Path, n_files: int) -> int:
    """Write the side files and Anserini's JsonCollection; one input file per indexing thread,
    because Anserini parallelises over files."""
    collection.mkdir()
    files = [open(collection / f"part-{i:03d}.jsonl", "w", encoding="utf-8") for i in range(n_files)]
    try:
        with PassageWriter(index_dir) as side:
            for p in passages:
                position = side.add(p)
                doc = {"id": f"{position:0{ID_WIDTH}d}", "contents": f"{p.title}\n{p.text}"}
                files[position % n_files].write(json.dumps(doc, ensure_ascii=False) + "\n")
    finally:
        for f in files:
            f.close()
    return side.count


def _run_indexer(collection: Path, lucene_dir: Path, threads: int, show_progress: bool) -> None:
    java = java_home() / "bin" / "java"
    command = [
        str(java) if java.exists() else "java",
        "-cp",
        str(anserini_jar()),
        "io.anserini.index.IndexCollection",
        "-collection", "JsonCollection",
        "-generator", "DefaultLuceneDocumentGenerator",
        "-input", str(collection),
        "-index", str(lucene_dir),
        "-threads", str(max(1, threads)),
        "-optimize",  # one segment: faster searches
    ]  # fmt: skip
    output = None if show_progress else subprocess.PIPE
    done = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT if output else None, text=True)
    if done.returncode != 0:
        tail = (done.stdout or "")[-2000:]
        raise RuntimeError(f"Anserini's indexer failed (exit {done.returncode}): {' '.join(command)}\n{tail}")
