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
import math
import os
import random
import re
import shutil
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from capo_envs.retrieval import open_retriever
from capo_envs.webshop.env import SIZES, prepared_dir
from capo_envs.webshop.products import (
    PRICE_SEED, human_goals, load_products, parse_pricing, product_prices, shuffle_goals, synthetic_goals,
)  # fmt: skip
from capo_envs.webshop.shop import SqliteStore, product_passages

from .building import BadFileError, PrepareError, building, data_root, versions
from .download import forget, gdrive_url
from .manifest import FORMAT, file_records, is_complete, read_manifest, write_manifest
from .progress import progress_bar
from .sources import MIRROR_ENV, Remote, fetch

log = logging.getLogger(__name__)

NAME = "webshop"
DATASETS = (NAME,)
WS_COMMIT = "64fa2a5c15c7daa698b9ac93f5bb5437b634c9bd"
HUMAN_GOALS_CHECK = Remote(
    f"https://raw.githubusercontent.com/princeton-nlp/WebShop/{WS_COMMIT}/baseline_models/data/human_goals.json",
    "human_goals.json",
    sha256="b68746ed66cd31fdc5f70eb3f5831a46b38163563b57a66ddcab8fd60ee0cbdc",
    size=999_419,
    note="the 12,087 human instructions in canonical goal order (WebShop repository)",
)
# The Drive files have no pinned size, so each has a cap on the bytes a download may bring (a wrong or
# hostile host cannot fill the disk): far above the real files' sizes, which are MBs for the 1,000-product
# files and the human instructions, and a few GB for the full product file.
MiB, GiB = 1 << 20, 1 << 30
HUMAN_INS = Remote(gdrive_url("14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O"), "items_human_ins.json", max_bytes=1 * GiB,
                   note="WS setup.sh")
WEBSHOP_SOURCES: dict[str, dict[str, Remote]] = {
    "small": {
        "products": Remote(gdrive_url("1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib"), "items_shuffle_1000.json",
                           max_bytes=512 * MiB, note="WS setup.sh"),
        "attributes": Remote(
            gdrive_url("1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu"), "items_ins_v2_1000.json",
            sha256="f88a36314a397b53b3d9c3fa5878e5f7b26d35019a51ec83fbedeca61a948f6f", size=147_099,
            note="WS setup.sh; sha256 of the same bytes committed in WooooDyy/AgentGym and ZihanWang314/webshop-minimal",
        ),
        "human": HUMAN_INS,
    },
    "full": {
        "products": Remote(gdrive_url("1A2whVgOO0euk5O13n2iYDM0bQRkkRduB"), "items_shuffle.json",
                           max_bytes=64 * GiB, note="WS setup.sh"),
        "attributes": Remote(gdrive_url("1s2j6NgHljiZzQNL3veZaAiyW_qDEgBNi"), "items_ins_v2.json",
                             max_bytes=8 * GiB, note="WS setup.sh"),
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
# Synthetic goals are one per combination of a product's option values; the real products have at most
# a few thousand. A product over this cap is refused (12 options of 10 values would be 10**12 goals).
MAX_OPTION_COMBINATIONS = 100_000
MAX_RECORD_CHARS = 64 << 20  # one product record of items_shuffle*.json (the real ones: a few KB)


def iter_json_array(path: Path, chunk_chars: int = 1 << 22, max_record_chars: int = MAX_RECORD_CHARS) -> Iterator:
    """Stream the values of a top-level JSON array (items_shuffle.json is several GB) without loading it;
    a value longer than ``max_record_chars`` is refused rather than buffered."""
    try:
        yield from _iter_json_array(path, chunk_chars, max_record_chars)
    except UnicodeDecodeError as error:
        raise BadFileError(f"{path.name}: not UTF-8 text ({error.reason} at byte {error.start} of a chunk)", path) from None


def _iter_json_array(path: Path, chunk_chars: int, max_record_chars: int) -> Iterator:
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buffer, pos = f.read(chunk_chars), 0
        pos = _skip(buffer, pos, " \t\r\n")
        if buffer[pos : pos + 1] != "[":
            raise BadFileError(f"{path.name}: expected a JSON array", path)
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
                    if len(buffer) - pos > max_record_chars:
                        raise BadFileError(f"{path.name}: a record of more than {max_record_chars:,} characters near "
                                           f"offset {pos}: not WebShop's product file", path) from None
                    more = f.read(chunk_chars)
                    if not more:
                        raise BadFileError(f"{path.name}: truncated or invalid JSON near offset {pos}", path) from None
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


def read_json(path: Path):
    """A whole JSON file, or a :class:`PrepareError` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadFileError(f"{path.name}: not valid JSON ({error})", path) from None


def _is_text_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _attribute_problem(entry) -> str | None:
    """Why an entry of items_ins_v2*.json is not one the build can use (None: it is)."""
    if not isinstance(entry, dict):
        return "not an object"
    if "attributes" in entry and not _is_text_list(entry["attributes"]):
        return "attributes is not a list of strings"
    instruction = entry.get("instruction")
    if instruction is not None:
        if not isinstance(instruction, str):
            return "instruction is not a string"
        if not (_is_text_list(entry.get("instruction_attributes")) and entry["instruction_attributes"]):
            return "an instruction without a list of instruction_attributes"
    elif entry.get("instruction_attributes") is not None and not _is_text_list(entry["instruction_attributes"]):
        return "instruction_attributes is not a list of strings"
    return None


def _human_record_problem(record) -> str | None:
    if not isinstance(record, dict):
        return "not an object"
    if not isinstance(record.get("instruction"), str):
        return "instruction is not a string"
    if not _is_text_list(record.get("instruction_attributes")):
        return "instruction_attributes is not a list of strings"
    if not isinstance(record.get("instruction_options"), list):
        return "instruction_options is not a list"
    return None


def _product_problem(raw) -> str | None:
    """Why a record of items_shuffle*.json cannot be loaded (None: it can), checked on the fields
    ``load_products`` and the goal builders read, so a malformed record is skipped instead of crashing."""
    if not isinstance(raw, dict):
        return f"not an object ({type(raw).__name__})"
    for key in ("asin", "name", "query", "category", "product_category"):
        if not isinstance(raw.get(key), str):
            return f"{key} is not a string"
    if "full_description" not in raw or not isinstance(raw["full_description"], (str, type(None))):
        return "full_description is missing or not a string"
    small = raw.get("small_description", ...)
    if not (small is None or isinstance(small, str) or (isinstance(small, list) and
                                                         all(isinstance(b, (str, type(None))) for b in small))):
        return "small_description is missing or not a string or list of strings"
    if not isinstance(raw.get("images"), (list, type(None))):
        return "images is not a list"
    options = raw.get("customization_options")
    if options not in (None, "") and not isinstance(options, dict):
        return "customization_options is not an object"
    for name, contents in (options or {}).items():
        if contents is not None and not (isinstance(contents, list) and all(
                isinstance(c, dict) and isinstance(c.get("value"), str) for c in contents)):
            return f"customization option {name!r} is not a list of {{value: string}}"
    pricing = raw.get("pricing")
    if pricing is not None and not isinstance(pricing, str):
        return "pricing is not a string"
    try:
        parse_pricing(pricing)
    except (ValueError, ArithmeticError, LookupError):
        return f"pricing {str(pricing)[:40]!r} cannot be read"
    return None


def _summary(problems: Counter, what: str) -> str:
    return f"skipped {sum(problems.values())} malformed {what}(s): " + "; ".join(
        f"{reason} ({n})" for reason, n in problems.most_common(5))


def load_attributes(path: Path) -> tuple[dict, Counter]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise BadFileError(f"{path.name}: expected a JSON object of asin -> attributes, got {type(data).__name__}", path)
    good, problems = {}, Counter()
    for asin, entry in data.items():
        problem = _attribute_problem(entry)
        if problem is None:
            good[asin] = entry
        else:
            problems[problem] += 1
    if data and not good:
        raise BadFileError(f"{path.name}: expected a JSON object of asin -> attributes; no entry has that shape "
                           f"({_summary(problems, 'entry')})", path)
    return good, problems


def load_human_instructions(path: Path) -> tuple[dict, Counter]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise BadFileError(f"{path.name}: expected a JSON object of asin -> instruction records, got "
                           f"{type(data).__name__}", path)
    good, problems = {}, Counter()
    for asin, records in data.items():
        if not isinstance(records, list):
            problems["not a list of records"] += 1
            continue
        kept = []
        for record in records:
            problem = _human_record_problem(record)
            if problem is None:
                kept.append(record)
            else:
                problems[problem] += 1
        if kept:
            good[asin] = kept
    if data and not good:
        raise BadFileError(f"{path.name}: expected a JSON object of asin -> instruction records; no entry has "
                           f"that shape ({_summary(problems, 'record')})", path)
    return good, problems


def build(files: dict[str, Path], out: Path, *, size: str, price_seed: int, retrievers: list[str], progress: bool) -> dict:
    """Products, prices, goals and indexes from the downloaded files into ``out``; returns the counts.

    Records of the wrong shape (not an object, a field of the wrong type) are skipped, counted in the
    manifest and summarised in the log; a file of the wrong shape, or with no usable record, is an error."""
    attributes, bad_attributes = load_attributes(files["attributes"])
    human_ins, bad_human = load_human_instructions(files["human"])
    bad_products: Counter = Counter()
    rng = random.Random(price_seed)
    goal_products_h: list[dict] = []
    goal_products_s: list[dict] = []
    passages, prices = [], {}

    def loaded() -> Iterator[dict]:
        seen: set[str] = set()
        for raw in progress_bar(iter_json_array(files["products"]), desc="webshop products", disable=not progress):
            problem = _product_problem(raw)
            if problem is not None:
                bad_products[problem] += 1
                continue
            asin = raw["asin"]
            if asin in seen:
                continue
            try:
                products = load_products([raw], attributes, human_ins, human_goals=True)
            except (KeyError, TypeError, AttributeError, ValueError, ArithmeticError) as error:
                bad_products[f"the loader failed ({type(error).__name__})"] += 1
                continue
            if not products:
                continue
            seen.add(asin)
            p = products[0]
            entry = attributes.get(asin, {})
            if entry.get("instruction") is not None:
                combinations = math.prod(len(values) for values in p["options"].values())
                if combinations > MAX_OPTION_COMBINATIONS:
                    raise BadFileError(
                        f"{files['products'].name}: product {asin} has {combinations:,} option combinations, over the "
                        f"cap of {MAX_OPTION_COMBINATIONS:,} synthetic goals per product: not WebShop's product file",
                        files["products"])
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
    for problems, what, name in ((bad_products, "product record", files["products"].name),
                                 (bad_attributes, "attribute entry", files["attributes"].name),
                                 (bad_human, "human instruction record", files["human"].name)):
        if problems:
            log.warning("%s: %s", name, _summary(problems, what))
    if count == 0:
        raise BadFileError(f"{files['products'].name} holds no usable product"
                           + (f" ({_summary(bad_products, 'product record')})" if bad_products else ""), files["products"])
    after_prices = rng.getstate()
    counts: dict = {"products": count, "malformed_products": sum(bad_products.values()),
                    "malformed_attribute_entries": sum(bad_attributes.values()),
                    "malformed_human_records": sum(bad_human.values())}
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``capo data prepare webshop`` beyond the common ones; each is a keyword of :func:`prepare`."""
    parser.add_argument("--size", choices=sorted(WEBSHOP_SOURCES), default="small",
                        help="small: 1,000 products (~MBs); full: ~1.18M products (several GB)")
    parser.add_argument("--price-seed", type=int, default=PRICE_SEED,
                        help=f"seed of the price draws the original leaves unseeded (default {PRICE_SEED})")
    parser.add_argument("--lucene", dest="retrievers", action="store_const", const=("bm25", "lucene"),
                        default=("bm25",), help="also build a Lucene index (pyserini, like the original)")


def prepare(
    name: str = NAME, *, data_dir: str | Path | None = None, force: bool = False, base_url: str | None = None,
    progress: bool = True, size: str = "small", price_seed: int = PRICE_SEED, retrievers: tuple[str, ...] = ("bm25",),
) -> Path:  # fmt: skip
    """Download one size's product files (resumed), build its folder (``webshop-small`` or ``webshop``) and
    return it; a prepared folder is left alone unless ``force``."""
    if name != NAME:
        raise KeyError(f"unknown dataset {name!r}; known: {NAME}")
    if size not in WEBSHOP_SOURCES:
        raise ValueError(f"size must be one of {sorted(WEBSHOP_SOURCES)}, got {size!r}")
    folder = SIZES[size]
    root = data_root(data_dir)
    final = root / folder
    if is_complete(final) and not force:
        log.info("%s is already prepared in %s (use --force to rebuild)", folder, final)
        return final
    cache = root / ".downloads" / folder
    with building(root, folder) as work:
        fetched = {key: fetch(remote, cache, base_url=base_url, progress=progress, force=force,
                              pinned_in="data_prep/webshop.py") for key, remote in WEBSHOP_SOURCES[size].items()}
        try:
            counts = build({k: p for k, (_, p) in fetched.items()}, work, size=size, price_seed=price_seed,
                           retrievers=list(retrievers), progress=progress)  # fmt: skip
        except BadFileError as error:
            forget(error.path)  # the rerun fetches that file again; the others stay cached
            raise
        manifest = {
            "name": folder, "format": FORMAT, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "mirror": base_url or os.environ.get(MIRROR_ENV) or None,
            "sources": [record for record, _ in fetched.values()], "counts": counts,
            "price_seed": price_seed, "goal_shuffle_seed": 233, "retrievers": list(retrievers),
            "versions": versions(), "files": file_records(work),
        }  # fmt: skip
        write_manifest(work, manifest)
    shutil.rmtree(cache, ignore_errors=True)
    log.info("%s: prepared in %s (%s)", folder, final, {k: v for k, v in counts.items() if isinstance(v, int)})
    return final


def data_info(name: str = NAME, data_dir: str | Path | None = None) -> list[dict]:
    """What ``capo data list|verify`` need: one folder per size (``webshop-small``, ``webshop``), where
    :func:`prepare` writes it and the env reads it."""
    out = []
    for size, folder in SIZES.items():
        path = prepared_dir(size, data_dir)
        manifest = read_manifest(path)
        counts = (manifest or {}).get("counts", {})
        out.append({"name": folder, "size": size, "path": path, "prepared": manifest is not None,
                    "prepare": f"capo data prepare webshop --size {size}",
                    "counts": {k: counts[k] for k in ("products", "goals_human", "goals_synthetic") if k in counts}})
    return out
