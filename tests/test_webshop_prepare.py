"""``capo data prepare webshop`` against a local 127.0.0.1 server holding files in the official formats."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import gymnasium as gym
import pytest

pytest.importorskip("thefuzz")

import capo_envs  # noqa: F401
from capo_envs.webshop.products import build_goals, human_goal_check_text, load_products
from capo_envs.webshop.world import generate_catalog
from data_prep import download as dl
from data_prep import webshop as prep
from data_prep.cli import data_main

from env_helpers import expert_metrics
from fixtures_official import FileServer, sha256_bytes

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "webshop"


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(dl, "RETRY_BACKOFF_S", 0.0)
    monkeypatch.delenv("CAPO_DATA_MIRROR", raising=False)


def human_instructions(raw: list[dict], attrs: dict, rng: random.Random) -> dict[str, list[dict]]:
    """items_human_ins.json's layout: asin -> records with instruction, attributes and options."""
    out: dict[str, list[dict]] = {}
    for product in raw[::3]:
        entry = attrs[product["asin"]]
        options = [c[0]["value"].lower() for c in (product["customization_options"] or {}).values() if c]
        records = [{
            "asin": product["asin"], "instruction": f"I want {product['query'].lower()} that is {a}.",
            "instruction_attributes": [a], "instruction_options": options, "worker_id": "w1",
        } for a in (entry["attributes"] or ["plain"])[:2]]  # fmt: skip
        records.append({**records[0], "instruction_attributes": []})  # skipped by the goal builder
        out[product["asin"]] = records
    return out


def official_files(raw: list[dict], attrs: dict) -> dict[str, bytes]:
    human = human_instructions(raw, attrs, random.Random(0))
    products = load_products(raw, attrs, human, human_goals=True)
    _, goals = build_goals(products, human=True, price_seed=0)
    check = [human_goal_check_text(g["instruction_text"]) for g in goals]  # canonical order, as the repo's file
    return {
        "products": json.dumps(raw, indent=1).encode(),
        "attributes": json.dumps(attrs).encode(),
        "human": json.dumps(human).encode(),
        "check": json.dumps(check, indent=4).encode(),
    }


def serve_release(server: FileServer, size: str, files: dict[str, bytes], monkeypatch, check=None) -> None:
    """Drive files behind Drive's warning page, the check file at its repository path; pins set to these bytes."""
    pinned = {}
    for key, remote in prep.WEBSHOP_SOURCES[size].items():
        data = files[key] if key != "check" or check is None else check
        if "id=" in remote.url:
            server.drive[remote.url.split("id=")[1]] = data
        else:
            server.add(remote.url.split("githubusercontent.com")[1], data, drop_after=len(data) // 2)
        pinned[key] = dataclasses.replace(remote, sha256=sha256_bytes(data), size=len(data))
    monkeypatch.setitem(prep.WEBSHOP_SOURCES, size, pinned)


@pytest.fixture
def release():
    raw, attrs = generate_catalog(seed=7, num_products=150)
    return raw, attrs, official_files(raw, attrs)


def test_iter_json_array_streams_in_small_chunks(tmp_path):
    records = [{"asin": f"A{i}", "text": "x" * (i % 7), "nested": [1, {"b": "]"}]} for i in range(50)]
    path = tmp_path / "a.json"
    path.write_text(json.dumps(records, indent=2))
    assert list(prep.iter_json_array(path, chunk_chars=16)) == records
    path.write_text(json.dumps(records)[:-30])
    with pytest.raises(prep.PrepareError, match="truncated"):
        list(prep.iter_json_array(path, chunk_chars=64))


def test_prepare_small_builds_a_working_env(tmp_path, monkeypatch, release):
    raw, attrs, files = release
    with FileServer() as server:
        serve_release(server, "small", files, monkeypatch)
        code = data_main(["prepare", "webshop", "--size", "small", "--data-dir", str(tmp_path),
                          "--mirror", server.url, "--quiet"])  # fmt: skip
    assert code == 0
    root = tmp_path / "webshop-small"
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["counts"]["products"] == 150 and manifest["price_seed"] == 0
    assert manifest["counts"]["human_records_skipped"] == 50  # one empty-attribute record per product
    assert {s["file"] for s in manifest["sources"]} == {"items_shuffle_1000.json", "items_ins_v2_1000.json", "items_human_ins.json"}
    assert not (tmp_path / ".downloads" / "webshop-small").exists()

    env = gym.make("capo/WebShop-v0", size="small", data_dir=str(tmp_path), split="test", noun_tagger="heuristic")
    goals = json.loads((root / "goals_human.json").read_text())
    assert len(env.unwrapped.task_ids()) == min(500, len(goals)) and env.unwrapped.task_ids()[0] == "webshop-human-0"
    metrics = expert_metrics(env)
    assert sum(m["success"] for m in metrics) / len(metrics) >= 0.9
    synthetic = gym.make("capo/WebShop-v0", size="small", goals="synthetic", data_dir=str(tmp_path), noun_tagger="heuristic")
    obs, _ = synthetic.reset(seed=0)
    assert obs.startswith("WebShop [SEP] Instruction: [SEP] Find me ")


def test_goals_are_the_originals_with_a_fixed_price_seed(tmp_path, monkeypatch, release):
    raw, attrs, files = release
    with FileServer() as server:
        serve_release(server, "small", files, monkeypatch)
        prep.prepare("webshop", size="small", data_dir=tmp_path / "a", base_url=server.url, progress=False)
        prep.prepare("webshop", size="small", data_dir=tmp_path / "b", base_url=server.url, progress=False, price_seed=1)
    a = json.loads((tmp_path / "a" / "webshop-small" / "goals_human.json").read_text())
    b = json.loads((tmp_path / "b" / "webshop-small" / "goals_human.json").read_text())
    human = json.loads(files["human"])
    products = load_products(raw, attrs, human, human_goals=True)
    _, expected = build_goals(products, human=True, price_seed=0)
    assert a == json.loads(json.dumps(expected))  # the in-memory pipeline == the streaming one
    assert [g["asin"] for g in a] == [g["asin"] for g in b]  # the order depends only on the count (seed 233)
    assert [g["price_upper"] for g in a] != [g["price_upper"] for g in b]  # prices follow the price seed


def test_prepare_full_checks_the_canonical_order(tmp_path, monkeypatch, release):
    raw, attrs, files = release
    with FileServer() as server:
        serve_release(server, "full", files, monkeypatch)
        path = prep.prepare("webshop", size="full", data_dir=tmp_path, base_url=server.url, progress=False)
        assert len(server.ranges("/princeton-nlp/WebShop/" + prep.WS_COMMIT + "/baseline_models/data/human_goals.json")) == 1
    check = json.loads((path / "manifest.json").read_text())["counts"]["human_goal_order_check"]
    assert check["agreement"] == 1.0 and check["goals"] == check["expected"]


def test_prepare_full_fails_when_the_order_differs(tmp_path, monkeypatch, release):
    raw, attrs, files = release
    shuffled = json.loads(files["check"])
    random.Random(1).shuffle(shuffled)
    with FileServer() as server:
        serve_release(server, "full", files, monkeypatch, check=json.dumps(shuffled).encode())
        code = data_main(["prepare", "webshop", "--size", "full", "--data-dir", str(tmp_path), "--mirror", server.url, "--quiet"])
    assert code == 1
    assert not (tmp_path / "webshop").exists() and not list(tmp_path.glob("webshop.tmp-*"))


def test_a_corrupted_download_is_refused(tmp_path, monkeypatch, release):
    raw, attrs, files = release
    with FileServer() as server:
        serve_release(server, "small", files, monkeypatch)
        server.drive[prep.WEBSHOP_SOURCES["small"]["human"].url.split("id=")[1]] = b"{}"
        code = data_main(["prepare", "webshop", "--size", "small", "--data-dir", str(tmp_path), "--mirror", server.url, "--quiet"])
    assert code == 1 and not (tmp_path / "webshop-small" / "manifest.json").exists()


@pytest.mark.shared
@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data/webshop is absent")
def test_prepare_on_the_real_sample_products(tmp_path, monkeypatch):
    docs = [json.loads(line) for line in (SHARED / "resources_100" / "documents.jsonl").open()]
    raw_keys = ("name", "full_description", "images", "product_category", "average_rating", "small_description",
                "customization_options", "asin", "category", "query", "page")  # fmt: skip
    raw = []
    for d in docs:
        p = d["product"]
        pricing = p["pricing"]
        record = {k: p[k] for k in raw_keys}
        record["pricing"] = " - ".join(f"${x}" for x in pricing) if p["Price"] != "$100.0" else ""
        raw.append(record)
    attrs = json.loads((SHARED / "items_ins_v2_1000.json").read_text())
    files = official_files(raw, attrs)
    files["attributes"] = (SHARED / "items_ins_v2_1000.json").read_bytes()
    with FileServer() as server:
        serve_release(server, "small", files, monkeypatch)
        path = prep.prepare("webshop", size="small", data_dir=tmp_path, base_url=server.url, progress=False)
    store = json.loads((path / "manifest.json").read_text())
    assert store["counts"]["products"] == 100 and store["counts"]["goals_synthetic"] == 501
    env = gym.make("capo/WebShop-v0", size="small", goals="synthetic", data_dir=str(tmp_path), noun_tagger="heuristic").unwrapped
    product = env.store.get(docs[0]["id"])
    assert product["Price"] == docs[0]["product"]["Price"] and product["options"] == docs[0]["product"]["options"]
    assert product["Attributes"] == docs[0]["product"]["Attributes"]


@pytest.mark.java
@pytest.mark.slow
def test_lucene_index_like_the_original(tmp_path, monkeypatch, release):
    pytest.importorskip("pyserini", reason="pip install --no-deps pyserini==0.22.1 pyjnius")
    pytest.importorskip("jnius_config", reason="pip install --no-deps pyserini==0.22.1 pyjnius")
    from capo_envs.retrieval.lucene import java_home

    try:
        java_home()
    except RuntimeError as e:  # no JDK: skip, as tests/test_retrieval_lucene.py does
        pytest.skip(str(e))
    raw, attrs, files = release
    with FileServer() as server:
        serve_release(server, "small", files, monkeypatch)
        assert data_main(["prepare", "webshop", "--size", "small", "--data-dir", str(tmp_path), "--mirror", server.url,
                                  "--quiet", "--lucene"]) == 0  # fmt: skip
    env = gym.make("capo/WebShop-v0", size="small", data_dir=str(tmp_path), retriever="lucene", noun_tagger="heuristic")
    metrics = expert_metrics(env)
    assert sum(m["success"] for m in metrics) / len(metrics) >= 0.9
