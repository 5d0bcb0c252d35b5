"""Test helpers: write tiny files in the official release schemas, and serve them over local HTTP.

Nothing here is real data; the shapes follow the official files (see ../shared/data/*/SOURCE.md).
The server supports Range requests, can drop a connection mid-file, can ignore Range, and mimics
Google Drive's virus-scan warning page, so the download code meets what real hosts do.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import threading
import dataclasses
import urllib.parse
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from data_prep import sources

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"

# --- HotpotQA -----------------------------------------------------------------------------------------

_HOTPOT_PARAS = {
    "Alpha": ["Alpha is a town.", " It lies on a river."],
    "Beta": ["Beta was founded by Gamma.", " Beta is old."],
    "Gamma": ["Gamma (1900-1980) was a mayor."],
    "Delta": ["Delta is a river.", " It flows through Alpha."],
    "Epsilon": ["Epsilon is a film."],
}


def _ctx(*titles: str) -> list:
    return [[t, list(_HOTPOT_PARAS[t])] for t in titles]


def hotpot_records(split: str) -> list[dict]:
    """Train: 2 records, dev: 2 records; 5 distinct paragraphs plus one whitespace-only variant
    of "Gamma" (a duplicate) and a second "Alpha" text (not a duplicate): 6 unique passages."""
    if split == "train":
        return [
            {"_id": "t1", "answer": "Gamma", "question": "Who founded Beta?",
             "supporting_facts": [["Beta", 0], ["Beta", 1], ["Gamma", 0]], "context": _ctx("Alpha", "Beta", "Gamma"),
             "type": "bridge", "level": "easy"},
            {"_id": "t2", "answer": "yes", "question": "Are Alpha and Delta connected?",
             "supporting_facts": [["Delta", 1], ["Alpha", 0]], "context": _ctx("Beta", "Delta", "Alpha"),
             "type": "comparison", "level": "medium"},
        ]
    return [
        {"_id": "d1", "answer": "a film", "question": "What is Epsilon?", "supporting_facts": [["Epsilon", 0]],
         "context": _ctx("Epsilon", "Delta") + [["Gamma", ["Gamma  (1900-1980) was a mayor. "]]],
         "type": "bridge", "level": "hard"},
        {"_id": "d2", "answer": "1980", "question": "When did Gamma die?", "supporting_facts": [["Gamma", 0]],
         "context": _ctx("Gamma") + [["Alpha", ["Alpha is also a letter."]]], "type": "bridge", "level": "hard"},
    ]


HOTPOT_UNIQUE_PASSAGES = 6


def write_hotpotqa(folder: Path) -> dict[str, Path]:
    """The two official file names; compact JSON, like the official release."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, name in (("train", "hotpot_train_v1.1.json"), ("dev", "hotpot_dev_distractor_v1.json")):
        out[split] = folder / name
        out[split].write_text(json.dumps(hotpot_records(split), separators=(",", ":")), encoding="utf-8")
    return out


# --- 2WikiMultihopQA ------------------------------------------------------------------------------------


def twowiki_records(split: str) -> list[dict]:
    """2 train + 1 dev record, 4 unique paragraphs; dev's answer Q30 has aliases in id_aliases.json."""
    ctx = {
        "Lothair II": ["Lothair II was a king.", "His mother was Ermengarde of Tours."],
        "Ermengarde of Tours": ["Ermengarde of Tours died on 20 March 851."],
        "Teutberga": ["Teutberga was a queen."],
        "United States": ["The United States is a country."],
    }

    def record(rid, question, answer, answer_id, titles, kind="compositional"):
        return {"_id": rid, "type": kind, "question": question, "context": [[t, ctx[t]] for t in titles],
                "entity_ids": "Q1_Q2", "supporting_facts": [[titles[0], 1], [titles[1], 0]],
                "evidences": [[titles[0], "mother", titles[1]]], "answer": answer,
                "evidences_id": [], "answer_id": answer_id}

    if split == "train":
        return [record("w1", "When did Lothair II's mother die?", "20 March 851", None,
                       ["Lothair II", "Ermengarde of Tours", "Teutberga"]),
                record("w2", "Who was Lothair II's mother?", "Ermengarde of Tours", "Q2",
                       ["Lothair II", "Ermengarde of Tours"])]
    return [record("w3", "Which country?", "United States", "Q30", ["United States", "Teutberga"], "comparison")]


TWOWIKI_UNIQUE_PASSAGES = 4


def write_2wiki_zip(path: Path) -> Path:
    """Like data_ids_april7.zip: a folder of JSON arrays, JSONL aliases, and macOS junk to ignore."""
    aliases = [{"Q_id": "Q30", "aliases": ["USA", "United States of America"], "demonyms": ["American"]}]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("data_ids_april7/train.json", json.dumps(twowiki_records("train"), indent=4))
        zf.writestr("data_ids_april7/dev.json", json.dumps(twowiki_records("dev"), indent=4))
        zf.writestr("data_ids_april7/test.json", "[]")
        zf.writestr("data_ids_april7/id_aliases.json", "".join(json.dumps(a) + "\n" for a in aliases))
        zf.writestr("__MACOSX/data_ids_april7/._dev.json", b"\x00\x05\x16\x07junk")
    return path


# --- MuSiQue ----------------------------------------------------------------------------------------------


def musique_record(rid: str, answerable: bool = True, shift: int = 0) -> dict:
    """20 paragraphs (idx 0-19); hops are supported by paragraphs 3 and 7. ``shift`` varies the texts."""
    paragraphs = [{"idx": i, "title": f"Title {i + shift}", "paragraph_text": f"Text of paragraph {i + shift}.",
                   "is_supporting": i in (3, 7)} for i in range(20)]
    return {"id": rid, "paragraphs": paragraphs, "question": f"Question {rid}?",
            "question_decomposition": [
                {"id": 1, "question": "first hop", "answer": "X", "paragraph_support_idx": 3},
                {"id": 2, "question": "#1 >> second hop", "answer": "Y", "paragraph_support_idx": 7 if answerable else None}],
            "answer": "Y", "answer_aliases": ["Why"], "answerable": answerable}


MUSIQUE_TRAIN = [musique_record("2hop__1_2"), musique_record("2hop__3_4", shift=10)]  # paragraphs 0-29
MUSIQUE_DEV = [musique_record("2hop__5_6", shift=25), musique_record("2hop__5_6", answerable=False, shift=25)]
MUSIQUE_UNIQUE_PASSAGES = 45  # titles 0..44


def write_musique_zip(path: Path) -> Path:
    """Like musique_v1.0.zip: data/*.jsonl, one record a line, plus files the loader ignores."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("data/musique_ans_v1.0_train.jsonl", "".join(json.dumps(r) + "\n" for r in MUSIQUE_TRAIN))
        zf.writestr("data/musique_ans_v1.0_dev.jsonl", "".join(json.dumps(r) + "\n" for r in MUSIQUE_DEV))
        zf.writestr("data/musique_full_v1.0_dev.jsonl", "")
        zf.writestr("__MACOSX/data/._musique_ans_v1.0_dev.jsonl", b"junk")
    return path


# --- wiki-18 ------------------------------------------------------------------------------------------------

WIKI18 = [
    {"id": "0", "contents": '"Evan Morris"\nEvan Morris was a lobbyist.'},
    {"id": "1", "contents": "Absalon\nAbsalon was a bishop."},
    {"id": "2", "contents": '"Kite"\nA kite is a tethered aircraft.'},
]


def write_wiki18_gz(path: Path) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in WIKI18)
    return path


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buffer.getvalue()


# --- the HTTP server ----------------------------------------------------------------------------------------


@dataclass
class Served:
    data: bytes
    content_type: str = "application/octet-stream"
    drop_after: int | None = None  # send this many bytes, then close (once)
    ignore_range: bool = False  # answer 200 with the whole file even to a Range request
    no_length: bool = False  # no Content-Length: the body ends when the connection closes, complete or not


class _QuietServer(ThreadingHTTPServer):
    """A mirror that a client may hang up on mid-file (a downloader refusing an oversized file does): that is
    not an error of the mirror, so it prints no traceback into the output the tests read."""

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class FileServer:
    """A threaded HTTP server on 127.0.0.1:<free port>; use as a context manager."""

    files: dict[str, Served] = field(default_factory=dict)
    drive: dict[str, bytes] = field(default_factory=dict)  # Google Drive file id -> bytes
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path?query, Range header)

    def add(self, path: str, data: bytes, **options) -> str:
        self.files[path] = Served(data, **options)
        return self.url + path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def ranges(self, path: str) -> list[str]:
        return [r for p, r in self.requests if p.split("?")[0] == path and r]

    def __enter__(self) -> "FileServer":
        self._server = _QuietServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


def _drive_warning_page(server: FileServer, file_id: str) -> bytes:
    """The shape of Drive's current "can't scan for viruses" page: a GET form with confirm and uuid."""
    return f"""<!DOCTYPE html><html><head><title>Google Drive - Virus scan warning</title></head><body>
<div class="uc-main"><p class="uc-warning-subcaption">Google Drive can't scan this file for viruses.</p>
<form id="download-form" action="{server.url}/download" method="get">
<input type="submit" id="uc-download-link" value="Download anyway"/>
<input type="hidden" name="id" value="{file_id}"><input type="hidden" name="export" value="download">
<input type="hidden" name="confirm" value="t"><input type="hidden" name="uuid" value="3f2a-uuid"></form>
</div></body></html>""".encode()


def _handler(server: FileServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            server.requests.append((self.path, self.headers.get("Range")))
            path, _, query = self.path.partition("?")
            params = dict(urllib.parse.parse_qsl(query))
            if path == "/uc" and params.get("id") in server.drive:
                return self._send(200, _drive_warning_page(server, params["id"]), "text/html; charset=utf-8")
            if path == "/download" and params.get("id") in server.drive:
                if params.get("confirm") != "t" or not params.get("uuid"):
                    return self._send(403, b"<html>bad confirm</html>", "text/html")
                return self._serve(Served(server.drive[params["id"]], "application/zip"))
            if path not in server.files:
                return self._send(404, b"not found", "text/plain")
            self._serve(server.files[path])

        def _serve(self, served: Served) -> None:
            data, start = served.data, 0
            header = self.headers.get("Range")
            if header and not served.ignore_range:
                start = int(header.removeprefix("bytes=").split("-")[0])
                if start >= len(data):
                    return self._send(416, b"", "text/plain", {"Content-Range": f"bytes */{len(data)}"})
            body = data[start:]
            extra = {"Accept-Ranges": "bytes"}
            if served.no_length:
                self.close_connection = True
            if start:
                extra["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            if served.drop_after is not None:
                cut, served.drop_after = served.drop_after, None
                self.send_response(206 if start else 200)
                self._headers(served.content_type, None if served.no_length else len(body), extra)
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self._send(206 if start else 200, body, served.content_type, extra, length=not served.no_length)

        def _headers(self, content_type: str, length: int | None, extra: dict) -> None:
            self.send_header("Content-Type", content_type)
            if length is not None:
                self.send_header("Content-Length", str(length))
            for k, v in extra.items():
                self.send_header(k, v)
            self.end_headers()

        def _send(self, code: int, body: bytes, content_type: str, extra: dict | None = None,
                  length: bool = True) -> None:
            self.send_response(code)
            self._headers(content_type, len(body) if length else None, extra or {})
            self.wfile.write(body)

    return Handler


MUSIQUE_DRIVE_ID = "1tGdADlNjWFaHLeZZGShh2IRcpO6Lv24h"


def url_path(url: str) -> str:
    return urllib.parse.urlsplit(url).path


def serve(server: FileServer, files: dict[str, dict[str, bytes]], monkeypatch) -> None:
    """Serve every file (MuSiQue through the Drive warning page) and pin the sources to these bytes."""
    for name, by_path in files.items():
        pinned = []
        for remote in sources.SOURCES[name]:
            path = url_path(remote.url)
            data = by_path[path]
            if path == "/uc":
                server.drive[MUSIQUE_DRIVE_ID] = data
            else:
                server.add(path, data)
            pinned.append(dataclasses.replace(remote, sha256=sha256_bytes(data), size=len(data), members={}))
        monkeypatch.setitem(sources.SOURCES, name, tuple(pinned))


def shared_files(tmp: Path) -> dict[str, dict[str, bytes]]:
    """The samples repackaged as the releases: MuSiQue arrays become JSONL lines, as upstream ships."""
    hotpot, wiki, mus = SHARED / "hotpotqa", SHARED / "2wikimultihopqa", SHARED / "musique"

    def jsonl(path: Path) -> bytes:
        return "".join(json.dumps(r) + "\n" for r in json.loads(path.read_text())).encode()

    two = (wiki / "qa_sub.json").read_bytes()
    return {
        "hotpotqa": {"/datasets/hotpot/hotpot_train_v1.1.json": (hotpot / "hotpotqa_train.json").read_bytes(),
                     "/datasets/hotpot/hotpot_dev_distractor_v1.json":
                         (hotpot / "hotpot_dev_distractor_v1.first53.json").read_bytes()},
        "2wiki": {"/s/ms2m13252h6xubs/data_ids_april7.zip":
                  zip_bytes({"data_ids_april7/train.json": two, "data_ids_april7/dev.json": two})},
        "musique": {"/uc": zip_bytes({"data/musique_ans_v1.0_train.jsonl": jsonl(mus / "musique_train.json"),
                                      "data/musique_ans_v1.0_dev.jsonl": jsonl(mus / "musique_qa_100.json")})},
        "wiki18": {"/datasets/PeterJinGo/wiki-18-corpus/resolve/main/wiki-18.jsonl.gz":
                   gzip.compress((SHARED / "wiki_passages" / "sample_data.jsonl").read_bytes())},
    }
