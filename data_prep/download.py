"""Resumable, verified HTTP downloads with urllib only (no ``requests`` dependency).

A download streams into ``<dest>.part``, resumes it with a Range request after a dropped connection,
checks size and sha256, and only then renames it to ``dest``. Without a pinned size or sha256 the file is
known to be complete only when the server said how long it is (Content-Length, Content-Range) or, when it
did not, answers a Range request from the last byte with 416; such a download is recorded in
``<dest>.complete``. A cached ``dest`` is reused only when its pins match or that record does: anything
else (a truncated download cached by an older version, one no server could vouch for) is fetched again.
Google Drive's "can't scan this file for viruses" page is answered like a browser would.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

from .progress import progress_bar

log = logging.getLogger(__name__)

CHUNK = 1 << 20
RETRY_BACKOFF_S = 0.5  # doubled after each failed try
USER_AGENT = "capo-gym-data-prep/0.1 (+urllib)"


class DownloadError(RuntimeError):
    """A download that could not be completed; a ``.part`` may remain for a later resume."""


class ChecksumError(DownloadError):
    """The bytes arrived but are not the expected file; nothing is kept."""


class _Retryable(DownloadError):
    """A dropped connection or a server error: the next try resumes the ``.part`` with a Range request."""


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def gdrive_url(file_id: str) -> str:
    """The direct-download URL of a public Google Drive file."""
    return "https://drive.google.com/uc?" + urllib.parse.urlencode({"export": "download", "id": file_id})


class _DriveConfirmParser(HTMLParser):
    """Finds the confirm form (or, on older pages, the confirm link) of Drive's virus-scan warning."""

    def __init__(self) -> None:
        super().__init__()
        self.action: str | None = None
        self.fields: dict[str, str] = {}
        self.confirm_href: str | None = None
        self._in_form = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and self.action is None and ("download" in a.get("action", "") or a.get("id") == "download-form"):
            self.action, self._in_form = a.get("action", ""), True
        elif tag == "input" and self._in_form and a.get("name"):
            self.fields[a["name"]] = a.get("value", "")
        elif tag == "a" and "confirm=" in a.get("href", ""):
            self.confirm_href = a["href"]

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._in_form = False


def drive_confirm_url(page_url: str, html: str) -> str | None:
    """The URL that downloads the file behind a Drive warning page, or None if the page has none."""
    parser = _DriveConfirmParser()
    parser.feed(html)
    if parser.action is not None and "confirm" in parser.fields:
        action = urllib.parse.urljoin(page_url, parser.action)
        return action + ("&" if "?" in action else "?") + urllib.parse.urlencode(parser.fields)
    if parser.confirm_href:
        return urllib.parse.urljoin(page_url, parser.confirm_href.replace("&amp;", "&"))
    return None


_OPENER = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())


def _open(url: str, start: int, timeout: float) -> http.client.HTTPResponse | None:
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if start:
        request.add_header("Range", f"bytes={start}-")
    try:
        return _OPENER.open(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code >= 500 or e.code == 429:
            raise _Retryable(f"{url}: HTTP {e.code} {e.reason}") from None
        if e.code == 416 and start:
            return None  # the .part already holds every byte (or is junk): _verify decides
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None


def _open_file(url: str, start: int, timeout: float) -> http.client.HTTPResponse | None:
    """Open ``url`` from byte ``start``, answering Drive's HTML warning page when it comes instead.

    The files fetched here are never HTML, so an HTML answer is either that page or an error.
    """
    response = _open(url, start, timeout)
    if response is None or response.status != 200 or response.headers.get_content_type() != "text/html":
        return response
    with response:
        html = response.read(2_000_000).decode("utf-8", "replace")
        page_url = response.geturl() or url
    confirm = drive_confirm_url(page_url, html)
    if confirm is None:
        hint = " (Drive's download quota is exhausted; retry later)" if "quota" in html.lower() else ""
        raise DownloadError(f"{url} returned an HTML page, not the file{hint}")
    response = _open(confirm, start, timeout)
    if response is not None and response.status == 200 and response.headers.get_content_type() == "text/html":
        response.close()
        raise DownloadError(f"{url}: the Drive confirm link {confirm} returned an HTML page again")
    return response


def _too_large(url: str, part: Path, cap: int, pinned: bool, announced: int | None = None) -> ChecksumError:
    part.unlink(missing_ok=True)
    what = f"more than its pinned size of {cap:,} bytes" if pinned else f"more than the cap of {cap:,} bytes"
    said = f" (the server announces {announced:,})" if announced is not None else ""
    return ChecksumError(f"{url}: the file is {what}{said}; deleted what arrived. The source changed or the mirror "
                         f"is wrong.")


def _fetch_once(url: str, part: Path, timeout: float, progress: bool, desc: str,
                cap: tuple[int, bool] | None = None) -> bool:
    """Append the missing bytes to ``part``; raises _Retryable when the connection drops early, and
    :class:`ChecksumError` as soon as more than ``cap`` (bytes, whether it is a pinned size) arrives.

    Returns whether the server vouched for the length: it announced one and ``part`` has it, or it
    answered 416 to a Range request from the end of ``part``."""
    start = part.stat().st_size if part.exists() else 0
    response = _open_file(url, start, timeout)
    if response is None:
        return True
    with response:
        if response.status == 206:
            match = re.match(r"bytes (\d+)-\d+/(\d+|\*)", response.headers.get("Content-Range", ""))
            if not match or int(match.group(1)) != start:
                raise DownloadError(f"{url}: server answered Range {start}- with {response.headers.get('Content-Range')!r}")
            total = int(match.group(2)) if match.group(2) != "*" else None
            mode = "ab"
        else:  # 200: the server ignored the Range header (or none was sent), so start over
            start, mode = 0, "wb"
            length = response.headers.get("Content-Length")
            total = int(length) if length is not None else None
        if cap is not None and total is not None and total > cap[0]:
            raise _too_large(url, part, *cap, announced=total)
        written = start
        with open(part, mode) as out, progress_bar(desc=desc, total=total, initial=start, unit="B", tag="capo data",
                                                   file=sys.stderr, disable=not progress) as bar:
            try:
                for chunk in iter(lambda: response.read(CHUNK), b""):
                    written += len(chunk)
                    if cap is not None and written > cap[0]:
                        out.close()
                        raise _too_large(url, part, *cap)
                    out.write(chunk)
                    bar.update(len(chunk))
            except (OSError, http.client.HTTPException) as e:
                raise _Retryable(f"{url}: connection lost after {written} bytes ({e})") from None
        if total is not None and written < total:
            raise _Retryable(f"{url}: connection closed after {written} of {total} bytes")
    return total is not None or _confirm_end(url, written, timeout)


def _confirm_end(url: str, size: int, timeout: float) -> bool:
    """After a body without a length, which ends the same way whether it is complete or the connection
    dropped: ask for the bytes after ``size``. 416 says there are none; 206 that there are (resume);
    a 200 with a Content-Length tells the whole length; anything else leaves it unknown."""
    if size == 0:
        return False
    response = _open_file(url, size, timeout)
    if response is None:
        return True
    with response:
        length = response.headers.get("Content-Length")
        if response.status == 206 or (response.status == 200 and length is not None and int(length) > size):
            raise _Retryable(f"{url}: the connection closed after {size} bytes but the server has more")
        return response.status == 200 and length is not None and int(length) == size


def _verify(part: Path, url: str, sha256: str | None, size: int | None) -> None:
    actual_size = part.stat().st_size
    problem = None
    if size is not None and actual_size != size:
        problem = f"size {actual_size} bytes, expected {size}"
    elif sha256 is not None and (actual := sha256_file(part)) != sha256.lower():
        problem = f"sha256 {actual}, expected {sha256.lower()}"
    if problem:
        part.unlink()
        raise ChecksumError(f"{url}: downloaded file has {problem}; deleted it. The source changed or the mirror is wrong.")


def _record_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".complete")


def _cached(dest: Path, sha256: str | None, size: int | None) -> bool:
    """Whether ``dest`` is a complete earlier download: its pins match, or (without pins) its
    ``.complete`` record names its size. Anything else is deleted, to be fetched again."""
    record = _record_path(dest)
    if not dest.exists():
        record.unlink(missing_ok=True)
        return False
    if sha256 is not None or size is not None:
        try:
            _verify(dest, str(dest), sha256, size)
            return True
        except ChecksumError:  # a stale or damaged earlier download: _verify removed it
            record.unlink(missing_ok=True)
            return False
    try:
        complete = json.loads(record.read_text())["bytes"] == dest.stat().st_size
    except (OSError, ValueError, KeyError, TypeError):
        complete = False
    if not complete:
        log.info("%s: no record that this earlier download is complete; fetching it again", dest)
        dest.unlink()
        record.unlink(missing_ok=True)
    return complete


def forget(dest: str | Path) -> None:
    """Delete a download and its completeness record (a file found bad after it arrived), so the next
    :func:`download` of it fetches it again."""
    dest = Path(dest)
    for path in (dest, _record_path(dest)):
        path.unlink(missing_ok=True)


def download(
    url: str,
    dest: str | Path,
    *,
    sha256: str | None = None,
    size: int | None = None,
    progress: bool = True,
    retries: int = 3,
    timeout: float = 60,
    force: bool = False,
    max_bytes: int | None = None,
) -> Path:
    """Download ``url`` to ``dest`` and return ``dest``; a complete earlier ``dest`` is kept unless ``force``.

    A file larger than ``size`` (when pinned) or ``max_bytes`` is refused as soon as the server announces
    or sends more, so a wrong or hostile host cannot fill the disk.

    Network failures are retried ``retries`` times, each resuming the ``.part`` file; a checksum or
    size mismatch deletes the ``.part`` and raises :class:`ChecksumError` (no retry: it would repeat).
    A download nothing vouches for (no pins, and a server that gives no length and ignores Range) is
    returned but not recorded as complete, so the next call fetches it again.
    """
    dest = Path(dest)
    part = dest.with_suffix(dest.suffix + ".part")
    if force:
        for stale in (dest, _record_path(dest), part):
            stale.unlink(missing_ok=True)
    if _cached(dest, sha256, size):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    cap = (size, True) if size is not None else (max_bytes, False) if max_bytes is not None else None
    if cap is not None and part.exists() and part.stat().st_size > cap[0]:
        part.unlink()
    for attempt in range(retries + 1):
        try:
            vouched = _fetch_once(url, part, timeout, progress, dest.name, cap)
            break
        except (_Retryable, urllib.error.URLError, TimeoutError, ConnectionError) as e:
            if attempt == retries:
                resume = f"; rerun to resume {part}" if part.exists() else ""
                raise DownloadError(f"{url}: gave up after {retries + 1} tries ({e}){resume}") from None
            time.sleep(RETRY_BACKOFF_S * 2**attempt)
    _verify(part, url, sha256, size)
    os.replace(part, dest)
    if vouched or sha256 is not None or size is not None:
        tmp = dest.with_name(dest.name + ".complete.tmp")
        tmp.write_text(json.dumps({"url": url, "bytes": dest.stat().st_size}))
        os.replace(tmp, _record_path(dest))
    else:
        log.warning("%s: the server gave no length and ignores Range requests, so nothing shows the download is "
                    "complete; it will be fetched again next time", url)
    return dest
