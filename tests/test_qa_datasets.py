"""Loaders of the official HotpotQA / 2Wiki / MuSiQue files: fixtures in the schemas, then real samples."""

from __future__ import annotations

import json

import pytest

from capo_envs.core.paths import DataNotPreparedError
from capo_envs.qa.datasets import (
    QA_DATASETS,
    dedup_passages,
    load_2wiki,
    load_hotpotqa,
    load_musique,
    load_split,
    passages_from_files,
)
from capo_envs.retrieval.base import Passage

from fixtures_official import (
    HOTPOT_UNIQUE_PASSAGES,
    MUSIQUE_DEV,
    MUSIQUE_TRAIN,
    MUSIQUE_UNIQUE_PASSAGES,
    SHARED,
    hotpot_records,
    twowiki_records,
    write_hotpotqa,
)


def test_hotpotqa_fields(tmp_path):
    files = write_hotpotqa(tmp_path)
    task = load_hotpotqa(files["train"])[0]
    assert (task.id, task.question, task.answers, task.kind) == ("t1", "Who founded Beta?", ("Gamma",), "bridge")
    assert task.supporting_titles == task.expert_queries == ("Beta", "Gamma")
    passages = list(passages_from_files("hotpotqa", files.values()))
    assert len(passages) == HOTPOT_UNIQUE_PASSAGES
    assert [p.id for p in passages] == [str(i) for i in range(len(passages))]
    assert passages[0] == Passage("0", "Alpha", "Alpha is a town. It lies on a river.")


def test_2wiki_aliases_from_id_aliases_file(tmp_path):
    (tmp_path / "dev.json").write_text(json.dumps(twowiki_records("dev")))
    assert load_2wiki(tmp_path / "dev.json")[0].answers == ("United States",)
    (tmp_path / "id_aliases.json").write_text(
        json.dumps({"Q_id": "Q30", "aliases": ["USA", "United States"], "demonyms": ["American"]}) + "\n"
    )
    task = load_2wiki(tmp_path / "dev.json")[0]
    assert task.answers == ("United States", "USA", "American")
    assert task.supporting_titles == ("United States", "Teutberga") and task.kind == "comparison"


def test_musique_jsonl_and_json_array_and_unanswerable(tmp_path):
    jsonl = tmp_path / "dev.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in MUSIQUE_DEV))
    array = tmp_path / "dev.json"
    array.write_text(json.dumps(MUSIQUE_DEV, indent=4))
    for path in (jsonl, array):
        (task,) = load_musique(path)
        assert task.answers == ("Y", "Why") and task.kind == "2hop"
        assert task.supporting_titles == ("Title 28", "Title 32")  # paragraphs idx 3 and 7, shifted by 25
    assert len(load_musique(jsonl, include_unanswerable=True)) == 2
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in MUSIQUE_TRAIN))
    assert len(list(passages_from_files("musique", [train, jsonl]))) == MUSIQUE_UNIQUE_PASSAGES


def test_dedup_normalises_whitespace_and_keeps_first_seen_order():
    out = list(dedup_passages([Passage("a", "T", "x  y"), Passage("b", "T", "x y "), Passage("c", "U", "x y"),
                               Passage("d", "T", "  ")]))
    assert out == [Passage("0", "T", "x  y"), Passage("1", "U", "x y")]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.pop("answer"), r"record 1: missing field 'answer'"),
        (lambda r: r.update(question=7), r"record 1: field 'question' has type int"),
        (lambda r: r.update(context=[["T", "not a list"]]), r"record 1: field 'context': item 0"),
        (lambda r: r.update(supporting_facts=[["T"]]), r"record 1: field 'supporting_facts': item 0"),
    ],
)
def test_malformed_hotpot_record_names_file_record_and_field(tmp_path, mutate, message):
    records = hotpot_records("train")
    mutate(records[1])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(records))
    with pytest.raises(ValueError, match=message) as info:
        load_hotpotqa(path)
        list(passages_from_files("hotpotqa", [path]))
    assert str(path) in str(info.value)


def test_malformed_musique_hop_and_bad_json(tmp_path):
    record = dict(MUSIQUE_TRAIN[0], question_decomposition=[{"paragraph_support_idx": 99}])
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=r"record 0: field 'question_decomposition': hop 0 points to paragraph 99"):
        load_musique(path)
    path.write_text(json.dumps(MUSIQUE_TRAIN[0]) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"m.jsonl:2: not valid JSON"):
        load_musique(path)


def test_load_split_reads_raw_and_names_the_command_when_missing(tmp_path):
    with pytest.raises(DataNotPreparedError, match="Run: capo data prepare musique"):
        load_split("musique", "dev", data_dir=tmp_path)
    write_hotpotqa(tmp_path / "hotpotqa" / "raw")
    assert [t.id for t in load_split("hotpotqa", "dev", data_dir=tmp_path)] == ["d1", "d2"]
    with pytest.raises(KeyError):
        load_split("hotpotqa", "test", data_dir=tmp_path)


def test_registry_names():
    assert set(QA_DATASETS) == {"hotpotqa", "2wiki", "musique"}
    assert all(set(spec.files) == {"train", "dev"} for spec in QA_DATASETS.values())


# --- the real samples in ../shared/data ---------------------------------------------------------------------

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is absent")


@pytest.mark.shared
@needs_shared
def test_real_hotpotqa_dev_sample():
    path = SHARED / "hotpotqa" / "hotpot_dev_distractor_v1.first53.json"
    tasks = load_hotpotqa(path)
    assert len(tasks) == 53
    first = tasks[0]
    assert first.id == "5a8b57f25542995d1e6f1371" and first.answers == ("yes",)
    assert first.question == "Were Scott Derrickson and Ed Wood of the same nationality?"
    assert first.supporting_titles == ("Scott Derrickson", "Ed Wood") and first.kind == "comparison"
    assert sum(t.kind == "bridge" for t in tasks) == 39
    assert len(list(passages_from_files("hotpotqa", [path]))) == 521  # of 522 context paragraphs


@pytest.mark.shared
@needs_shared
def test_real_hotpotqa_train_sample_matches_hipporag_titles():
    path = SHARED / "hotpotqa" / "hotpotqa_train.json"
    assert len(load_hotpotqa(path)) == 100
    titles = {p.title for p in passages_from_files("hotpotqa", [path])}
    assert titles == set(json.loads((SHARED / "hotpotqa" / "hotpotqa_train_corpus.json").read_text()))


@pytest.mark.shared
@needs_shared
def test_real_2wiki_sample():
    tasks = load_2wiki(SHARED / "2wikimultihopqa" / "qa_sub.json")
    assert len(tasks) == 2
    assert tasks[0].question == "When did Lothair Ii's mother die?" and tasks[0].answers == ("20 March 851",)
    assert tasks[0].supporting_titles == ("Lothair II", "Ermengarde of Tours")
    assert tasks[1].answers == ("Phoolwari",)
    assert len(list(passages_from_files("2wiki", [SHARED / "2wikimultihopqa" / "qa_sub.json"]))) == 20


@pytest.mark.shared
@needs_shared
def test_real_musique_samples():
    dev = load_musique(SHARED / "musique" / "musique_qa_100.json")
    train_path = SHARED / "musique" / "musique_train.json"
    assert len(dev) == len(load_musique(train_path)) == 100
    first = dev[0]
    assert first.id == "2hop__82713_84616" and first.kind == "2hop"
    assert first.answers[0] == "for Best Performance by a Leading Actress in a Play in Ondine"
    assert "leading actress" in first.answers
    assert first.supporting_titles == ("My Fair Lady (film)", "List of awards and honours received by Audrey Hepburn")
    # HippoRAG's corpus for these 100 train questions is their de-duplicated paragraphs: 1,890.
    train_passages = list(passages_from_files("musique", [train_path]))
    hipporag = json.loads((SHARED / "musique" / "musique_train_corpus.json").read_text())
    assert len(train_passages) == len(hipporag) == 1890
    assert {(p.title, p.text) for p in train_passages} == {(r["title"], r["text"]) for r in hipporag}
    assert len(list(passages_from_files("musique", [train_path, SHARED / "musique" / "musique_qa_100.json"]))) == 3722
