"""``capo data prepare webshop --size small|full``: WebShop's released product files -> ``capo/WebShop-v0``.

Downloads (WS setup.sh; Google Drive ids, no checksums published: sha256s are pinned where the bytes are
known and otherwise computed and recorded in the manifest):

* small: items_shuffle_1000.json (1,000 products), items_ins_v2_1000.json (attributes);
* full: items_shuffle.json (~1.18M products), items_ins_v2.json;
* both: items_human_ins.json (human instructions); full also baseline_models/data/human_goals.json from
  the WebShop repository (the 12,087 human instructions in canonical goal order).

Build (streaming, so the full file need not fit in memory): ``load_products`` per record -> products.sqlite
(products + prices), the search text -> index/bm25; prices are drawn from ``random.Random(price_seed)``
(the original draws them unseeded: default seed ``PRICE_SEED`` = 0, recorded in the manifest); goals_human.json
and goals_synthetic.json are the original's goals shuffled with its seed 233. For ``full`` the human goals'
order is checked against human_goals.json (texts compared on letters and digits only). Everything is built
in ``<name>.tmp-<pid>/`` and renamed into place after the manifest is written; downloads resume.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from capo_train.progress import progress_bar

from capo_envs.core.paths import data_dir as default_data_dir
from capo_envs.core.paths import is_prepared
from capo_envs.retrieval import open_retriever
from capo_envs.webshop.make import SIZES, prepared_dir
from capo_envs.webshop.products import (
    PRICE_SEED, human_goals, load_products, product_prices, shuffle_goals, synthetic_goals,
)  # fmt: skip
from capo_envs.webshop.shop import SqliteStore, product_passages

from .datasets import _versions, building
from .download import DownloadError, download, gdrive_url, sha256_file
from .manifest import FORMAT, file_records, read_manifest, write_manifest
from .sources import Remote, mirrored

log = logging.getLogger(__name__)

WS_COMMIT = "64fa2a5c15c7daa698b9ac93f5bb5437b634c9bd"
HUMAN_GOALS_CHECK = Remote(
    f"https://raw.githubusercontent.com/princeton-nlp/WebShop/{WS_COMMIT}/baseline_models/data/human_goals.json",
    "human_goals.json",
    sha256="b68746ed66cd31fdc5f70eb3f5831a46b38163563b57a66ddcab8fd60ee0cbdc",
    size=999_419,
    note="the 12,087 human instructions in canonical goal order (WebShop repository)",
)
HUMAN_INS = Remote(gdrive_url("14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O"), "items_human_ins.json", note="WS setup.sh")
WEBSHOP_SOURCES: dict[str, dict[str, Remote]] = {
    "small": {
        "products": Remote(gdrive_url("1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib"), "items_shuffle_1000.json", note="WS setup.sh"),
        "attributes": Remote(
            gdrive_url("1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu"), "items_ins_v2_1000.json",
            sha256="f88a36314a397b53b3d9c3fa5878e5f7b26d35019a51ec83fbedeca61a948f6f", size=147_099,
            note="WS setup.sh; sha256 of the same bytes committed in WooooDyy/AgentGym and ZihanWang314/webshop-minimal",
        ),
        "human": HUMAN_INS,
    },
    "full": {
        "products": Remote(gdrive_url("1A2whVgOO0euk5O13n2iYDM0bQRkkRduB"), "items_shuffle.json", note="WS setup.sh"),
        "attributes": Remote(gdrive_url("1s2j6NgHljiZzQNL3veZaAiyW_qDEgBNi"), "items_ins_v2.json", note="WS setup.sh"),
        "human": HUMAN_INS,
        "check": HUMAN_GOALS_CHECK,
    },
}  # fmt: skip
CANONICAL_HUMAN_GOALS = 12_087
CHECK_MIN_AGREEMENT = 0.99
# Fields a goal builder reads from a product; only these are kept in memory during the streaming pass.
_GOAL_FIELDS = ("asin", "category", "query", "name", "Title", "product_category", "options", "instructions",
                "instruction_text", "instruction_attributes")  # fmt: skip
_STORE_DROP = ("instructions", "instruction_text", "instruction_attributes")


class PrepareError(RuntimeError):
    """The downloaded files are not what the original pipeline expects (or the order check failed)."""


def iter_json_array(path: Path, chunk_chars: int = 1 << 22) -> Iterator[dict]:
    """Stream the objects of a top-level JSON array (items_shuffle.json is several GB) without loading it."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buffer, pos = f.read(chunk_chars), 0
        pos = _skip(buffer, pos, " \t\r\n")
        if buffer[pos : pos + 1] != "[":
            raise PrepareError(f"{path.name}: expected a JSON array")
        pos += 1
        while True:
            pos = _skip(buffer, pos, " \t\r\n,")
            while pos >= len(buffer) - 1:
                more = f.read(chunk_chars)
                if not more:
                    break
                buffer, pos = buffer[pos:] + more, 0
                pos = _skip(buffer, pos, " \t\r\n,")
            if buffer[pos : pos + 1] == "]":
                return
            while True:
                try:
                    obj, end = decoder.raw_decode(buffer, pos)
                    break
                except json.JSONDecodeError:
                    more = f.read(chunk_chars)
                    if not more:
                        raise PrepareError(f"{path.name}: truncated or invalid JSON near offset {pos}") from None
                    buffer, pos = buffer[pos:] + more, 0
            yield obj
            pos = end
            if pos > chunk_chars:  # drop what was consumed
                buffer, pos = buffer[pos:], 0


def _skip(text: str, pos: int, chars: str) -> int:
    while pos < len(text) and text[pos] in chars:
        pos += 1
    return pos


def check_text(text: str) -> str:
    """Instruction text reduced to letters and digits, lower-cased, without the price suffix: how the human
    goals are compared with human_goals.json (which is lower-cased, without quotes or the price text)."""
    text = re.sub(r",? and price lower than \d+(\.\d+)? dollars$", "", text.strip())
    return re.sub(r"[^a-z0-9]", "", text.lower())


def check_human_goal_order(goals: list[dict], check_file: Path) -> dict:
    expected = json.loads(check_file.read_text(encoding="utf-8"))
    same = sum(check_text(g["instruction_text"]) == check_text(e) for g, e in zip(goals, expected))
    agreement = same / max(len(expected), 1)
    result = {"goals": len(goals), "expected": len(expected), "same_position": same, "agreement": round(agreement, 6)}
    if len(goals) != len(expected) or agreement < CHECK_MIN_AGREEMENT:
        raise PrepareError(
            f"the shuffled human goals do not follow {check_file.name}: {len(goals)} goals vs {len(expected)}, "
            f"{same} at the same position ({agreement:.2%}); the product file or the goal rules differ from the original's"
        )
    return result


def _fetch(remote: Remote, cache: Path, base_url: str | None, progress: bool, force: bool) -> tuple[dict, Path]:
    url = mirrored(remote.url, base_url)
    log.info("downloading %s", remote.filename)
    path = download(url, cache / remote.filename, sha256=remote.sha256, size=remote.size, progress=progress, force=force)
    record = {
        "url": url, "upstream_url": remote.url, "file": remote.filename, "bytes": path.stat().st_size,
        "sha256": remote.sha256 or sha256_file(path),
        "sha256_source": "pinned in data_prep/webshop.py, verified" if remote.sha256 else "computed after download",
    }  # fmt: skip
    return record, path


def build(files: dict[str, Path], out: Path, *, size: str, price_seed: int, retrievers: list[str], progress: bool) -> dict:
    """Products, prices, goals and indexes from the downloaded files into ``out``; returns the counts."""
    attributes = json.loads(files["attributes"].read_text(encoding="utf-8"))
    human_ins = json.loads(files["human"].read_text(encoding="utf-8"))
    rng = random.Random(price_seed)
    goal_products_h: list[dict] = []
    goal_products_s: list[dict] = []
    passages, prices = [], {}

    def loaded() -> Iterator[dict]:
        seen: set[str] = set()
        for raw in progress_bar(iter_json_array(files["products"]), desc="webshop products", disable=not progress):
            asin = raw.get("asin")
            if not isinstance(asin, str) or asin in seen:
                continue
            products = load_products([raw], attributes, human_ins, human_goals=True)
            if not products:
                continue
            seen.add(asin)
            p = products[0]
            entry = attributes.get(asin, {})
            # One pass serves both goal kinds: the synthetic fields come from the attribute file.
            p["instruction_text"], p["instruction_attributes"] = entry.get("instruction"), entry.get("instruction_attributes")
            prices.update(product_prices([p], rng))  # in product order, as generate_product_prices draws them
            passages.extend(product_passages([p]))
            keep = {k: p[k] for k in _GOAL_FIELDS if k in p}
            if "instructions" in p:
                goal_products_h.append(keep)
            if p["instruction_text"] is not None:
                goal_products_s.append(keep)
            yield {k: v for k, v in p.items() if k not in _STORE_DROP}

    count = SqliteStore.write(out / "products.sqlite", loaded(), prices)
    if count == 0:
        raise PrepareError(f"{files['products'].name} holds no usable product")
    after_prices = rng.getstate()
    counts: dict = {"products": count}
    rng_h = random.Random()
    rng_h.setstate(after_prices)
    goals_h, skipped = human_goals(goal_products_h, prices, rng_h)
    rng_s = random.Random()
    rng_s.setstate(after_prices)
    goals_s = synthetic_goals(goal_products_s, prices, rng_s)
    shuffle_goals(goals_h)
    shuffle_goals(goals_s)
    (out / "goals_human.json").write_text(json.dumps(goals_h, ensure_ascii=False))
    (out / "goals_synthetic.json").write_text(json.dumps(goals_s, ensure_ascii=False))
    counts.update(goals_human=len(goals_h), human_records_skipped=skipped, goals_synthetic=len(goals_s))
    if size == "full":
        counts["human_goal_order_check"] = check_human_goal_order(goals_h, files["check"])
    else:
        counts["human_goal_order_check"] = "not applicable: small mode keeps only the 1,000 products' goals"
    for kind in retrievers:
        log.info("webshop: building the %s index over %d products", kind, len(passages))
        options = {"show_progress": progress} if kind == "bm25" else {}
        open_retriever(kind, passages=passages, index_dir=out / "index" / kind, cache_size=0, **options).close()
    return counts


def prepare_webshop(
    size: str = "small", *, data_dir: str | Path | None = None, force: bool = False, base_url: str | None = None,
    price_seed: int = PRICE_SEED, retrievers: tuple[str, ...] = ("bm25",), progress: bool = True,
) -> Path:  # fmt: skip
    if size not in WEBSHOP_SOURCES:
        raise ValueError(f"size must be one of {sorted(WEBSHOP_SOURCES)}, got {size!r}")
    name = SIZES[size]
    root = Path(data_dir).expanduser() if data_dir else default_data_dir()
    final = root / name
    if is_prepared(name, root) and not force:
        log.info("%s is already prepared in %s (use --force to rebuild)", name, final)
        return final
    cache = root / ".downloads" / name
    with building(root, name) as work:
        fetched = {key: _fetch(remote, cache, base_url, progress, force) for key, remote in WEBSHOP_SOURCES[size].items()}
        counts = build({k: p for k, (_, p) in fetched.items()}, work, size=size, price_seed=price_seed,
                       retrievers=list(retrievers), progress=progress)  # fmt: skip
        manifest = {
            "name": name, "format": FORMAT, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "mirror": base_url or os.environ.get("CAPO_DATA_MIRROR") or None,
            "sources": [record for record, _ in fetched.values()], "counts": counts,
            "price_seed": price_seed, "goal_shuffle_seed": 233, "retrievers": list(retrievers),
            "versions": _versions(), "files": file_records(work),
        }  # fmt: skip
        write_manifest(work, manifest)
    shutil.rmtree(cache, ignore_errors=True)
    log.info("%s: prepared in %s (%s)", name, final, {k: v for k, v in counts.items() if isinstance(v, int)})
    return final


def data_info(data_dir: str | Path | None = None) -> list[dict]:
    """What ``capo data list|verify`` need: one folder per size (``webshop-small``, ``webshop``), where
    :func:`prepare_webshop` writes it and the env reads it."""
    out = []
    for size, name in SIZES.items():
        path = prepared_dir(size, data_dir)
        manifest = read_manifest(path)
        counts = (manifest or {}).get("counts", {})
        out.append({"name": name, "size": size, "path": path, "prepared": manifest is not None,
                    "prepare": f"capo data prepare webshop --size {size}",
                    "counts": {k: counts[k] for k in ("products", "goals_human", "goals_synthetic") if k in counts}})
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="capo data prepare webshop", description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(WEBSHOP_SOURCES), default="small",
                   help="small: 1,000 products (~MBs); full: ~1.18M products (several GB)")
    p.add_argument("--data-dir", help="default: $CAPO_DATA_DIR or ~/.cache/capo")
    p.add_argument("--force", action="store_true", help="download and rebuild even if prepared")
    p.add_argument("--mirror", help="replace the download hosts with this base URL (or set $CAPO_DATA_MIRROR)")
    p.add_argument("--price-seed", type=int, default=PRICE_SEED,
                   help=f"seed of the price draws the original leaves unseeded (default {PRICE_SEED})")
    p.add_argument("--lucene", action="store_true", help="also build a Lucene index (pyserini, like the original)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p  # fmt: skip


def prepare_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    retrievers = ("bm25", "lucene") if args.lucene else ("bm25",)
    try:
        path = prepare_webshop(args.size, data_dir=args.data_dir, force=args.force, base_url=args.mirror,
                               price_seed=args.price_seed, retrievers=retrievers, progress=not args.quiet)
    except (DownloadError, PrepareError, ValueError) as e:
        print(f"capo data prepare webshop: {e}", file=sys.stderr)
        return 1
    print(f"webshop ({args.size}) prepared in {path}")
    return 0


__all__ = ["prepare_main", "prepare_webshop", "iter_json_array", "check_human_goal_order", "data_info"]
