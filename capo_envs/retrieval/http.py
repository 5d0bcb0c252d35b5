"""A ``Retriever`` that queries a Search-R1-style ``/retrieve`` server over HTTP.

Lets an environment use an index served by another process or machine (ours from
``capo serve-retriever``, or Search-R1's own ``retrieval_server.py``) through the same interface as a
local index. Standard library only. Parsing is lenient because servers in the wild differ: documents
come as ``{id, title, text}``, as Search-R1's ``{id, contents}``, or as bare strings.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from typing import Any, Sequence

from .base import Hit, Retriever, check_search_args


class RetrieverHTTPError(RuntimeError):
    """The server refused the request (4xx), kept failing (5xx), or could not be reached."""


class HTTPRetriever(Retriever):
    def __init__(self, url: str, *, timeout: float = 30.0, retries: int = 3, batch_size: int = 64):
        """``url`` is the server's base URL or its full ``/retrieve`` URL. A failed request is tried
        again up to ``retries`` times (connection errors and 5xx only); queries are sent
        ``batch_size`` at a time so that one call never exceeds the server's per-request limit."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        base = url.rstrip("/")
        self.url = base if base.endswith("/retrieve") else base + "/retrieve"
        self.timeout = timeout
        self.retries = retries
        self.batch_size = batch_size

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_search_args(queries, k)
        results: list[list[Hit]] = []
        for start in range(0, len(queries), self.batch_size):
            batch = list(queries[start : start + self.batch_size])
            answer = self._post({"queries": batch, "topk": k, "return_scores": True})
            results.extend(self._parse_answer(answer, len(batch), k))
        return results

    def _post(self, payload: dict) -> Any:
        data = json.dumps(payload).encode("utf-8")
        request = urllib.request.Request(
            self.url, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = response.read()
                break
            except urllib.error.HTTPError as e:
                message = _error_message(e)
                if e.code < 500:
                    raise RetrieverHTTPError(f"{self.url} refused the request: HTTP {e.code}: {message}") from None
                failure = f"HTTP {e.code}: {message}"
            except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
                failure = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            if attempt == self.retries:
                raise RetrieverHTTPError(f"{self.url} failed after {attempt + 1} attempts; last error: {failure}")
            time.sleep(min(0.5 * 2**attempt, 8.0))
        try:
            return json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise RetrieverHTTPError(f"{self.url} answered with something that is not JSON: {body[:200]!r}") from None

    def _parse_answer(self, answer: Any, n_queries: int, k: int) -> list[list[Hit]]:
        per_query = answer.get("result") if isinstance(answer, dict) else answer
        if not isinstance(per_query, list) or len(per_query) != n_queries:
            raise RetrieverHTTPError(
                f"{self.url} answered {str(answer)[:200]!r}; expected a result list for each of {n_queries} queries"
            )
        return [[_hit_from_item(item) for item in items[:k]] for items in per_query]


def _error_message(error: urllib.error.HTTPError) -> str:
    """The server's ``{"error": ...}`` (ours) or ``{"detail": ...}`` (FastAPI's), else the raw body."""
    try:
        raw = error.read()
    except OSError:
        return error.reason
    try:
        payload = json.loads(raw)
        if isinstance(payload, dict):
            return str(payload.get("error") or payload.get("detail") or payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        pass
    return raw[:500].decode("utf-8", "replace") or str(error.reason)


def _hit_from_item(item: Any) -> Hit:
    """One result item: ``{"document": doc, "score": s}``, or a bare ``doc`` (``return_scores`` ignored)."""
    if isinstance(item, dict) and "document" in item:
        doc, score = item["document"], item.get("score")
    else:
        doc, score = item, None
    score = float(score) if isinstance(score, (int, float)) else 0.0
    if isinstance(doc, str):
        title, text = _split_contents(doc)
        return Hit("", title, text, score)
    if not isinstance(doc, dict):
        raise RetrieverHTTPError(f"cannot read a document from {str(item)[:200]!r}")
    doc_id = str(doc.get("id", doc.get("_id", doc.get("docid", ""))))
    if "text" in doc:
        return Hit(doc_id, str(doc.get("title") or ""), str(doc["text"]), score)
    title, text = _split_contents(str(doc.get("contents", doc.get("content", ""))))
    return Hit(doc_id, str(doc.get("title") or title), text, score)


def _split_contents(contents: str) -> tuple[str, str]:
    """Search-R1's ``contents`` is ``'"Title"\\ntext'``; without a newline it is all text."""
    if "\n" not in contents:
        return "", contents.strip()
    title, _, text = contents.partition("\n")
    return title.strip().strip('"'), text.strip()
