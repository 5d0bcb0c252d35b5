"""The viewer's files: the static page (``static/``, shipped with the package: no CDN) and the data files,
by path, for the server and for the static export (``capo view --html OUT``).

Paths: ``index.html``, ``app.js``, ``app.css``; ``data/site.js`` (the runs and grids), ``data/run-<i>.js``
(a run's curves, config and episode index), ``data/run-<i>-iter-<N>.js`` (the episodes of one recorded
iteration), ``data/run-<i>-eval-<N>.js`` (the held-out episodes of the evaluation after iteration N).
Data files are ``CAPO.put("<key>", <json>);``, read fresh from the run folders on each request (a live run
shows its new iterations on reload).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from .data import GridRef, RunRef, iteration_files, iteration_payload, run_payload, site_payload

STATIC = Path(__file__).with_name("static")
STATIC_FILES = {"index.html": "text/html", "app.js": "text/javascript", "app.css": "text/css"}
# Numbers in paths: ASCII digits, at most 9 (no int of 5000 digits; re.fullmatch: no trailing newline);
# anything else is a 404.
RUN_FILE = re.compile(r"data/run-([0-9]{1,9})\.js")
ITER_DATA = re.compile(r"data/run-([0-9]{1,9})-(iter|eval)-([0-9]{1,9})\.js")


class Site:
    """The files of one ``capo view`` invocation."""

    def __init__(self, runs: list[RunRef], grids: list[GridRef]):
        self.runs, self.grids = runs, grids

    def get(self, path: str) -> tuple[bytes, str] | None:
        """``(body, content type)`` of a path, or None when there is no such file."""
        path = path.lstrip("/") or "index.html"
        if path in STATIC_FILES:
            return (STATIC / path).read_bytes(), STATIC_FILES[path] + "; charset=utf-8"
        if path == "data/site.js":
            return script("site", site_payload(self.runs, self.grids)), "text/javascript; charset=utf-8"
        m = RUN_FILE.fullmatch(path)
        if m and int(m.group(1)) < len(self.runs):
            i = int(m.group(1))
            return script(f"run-{i}", run_payload(self.runs[i])), "text/javascript; charset=utf-8"
        m = ITER_DATA.fullmatch(path)
        if m and int(m.group(1)) < len(self.runs):
            i, kind, it = int(m.group(1)), m.group(2), int(m.group(3))
            try:
                payload = iteration_payload(self.runs[i], it, held_out=kind == "eval")
            except Exception as e:  # a safety net: a note on the page, not an error answer
                payload = {"iteration": it, "episodes": [],
                           "notes": [f"cannot show these episodes: {type(e).__name__}: {e}"]}
            return script(f"run-{i}-{kind}-{it}", payload), "text/javascript; charset=utf-8"
        return None

    def paths(self) -> list[str]:
        """Every file of the site (what the static export writes)."""
        out = list(STATIC_FILES) + ["data/site.js"]
        for i, run in enumerate(self.runs):
            out.append(f"data/run-{i}.js")
            out += [f"data/run-{i}-iter-{it}.js" for it in iteration_files(run.path)]
            out += [f"data/run-{i}-eval-{it}.js" for it in iteration_files(run.path, held_out=True)]
        return out

    def export(self, out_dir: str | Path) -> Path:
        """Write every file under ``out_dir`` (a fresh folder, swapped in whole: a failed export leaves the
        old one); open ``out_dir/index.html`` in a browser, no server needed."""
        out = Path(out_dir)
        tmp = out.with_name(f".{out.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        for path in self.paths():
            found = self.get(path)
            if found is None:  # listed, then gone (a live run's folder)
                continue
            body = found[0]
            target = tmp / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(body)
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
        return out


def script(key: str, payload: dict) -> bytes:
    """``CAPO.put(key, payload);`` with ``</`` escaped, so no text in a run can close the script."""
    # allow_nan: NaN and Infinity are valid JavaScript, which is what this is
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=True, default=str)
    data = data.replace("</", "<\\/").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    # a lone surrogate ("\\ud800" in a run's JSON) has no UTF-8: written back as the same escape, in a string
    return f"CAPO.put({json.dumps(key)},{data});\n".encode("utf-8", "backslashreplace")
