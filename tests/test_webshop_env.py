"""WebShop's engine (pages, buttons, text observations, actions) and the SynthShop env's contract and oracle."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

pytest.importorskip("thefuzz")

import capo_envs  # noqa: F401  (registers the ids)
from capo_envs.core import DataNotPreparedError
from capo_envs.webshop.env import ShopEnv
from capo_envs.webshop.products import load_products
from capo_envs.webshop.protocol import TOOLS, WebShopProtocol
from capo_envs.webshop.shop import MemoryStore, ProductSearch
from capo_envs.webshop.synth import SynthShopEnv

from env_helpers import expert_metrics

INSTRUCTION = "i need slim fit chino pants in black, and price lower than 40.00 dollars"


def raw_product(i: int, **overrides) -> dict:
    p = {
        "asin": f"B0TEST{i:04d}", "name": f"Chino Pants Model {i}", "full_description": f"Chino number {i}.",
        "small_description": [f"Bullet {i}", "More"], "pricing": "$25.99" if i % 2 else "$25.99 - $32.99",
        "images": ["img"], "product_category": "Clothing › Men › Pants", "query": "Men's Pants", "category": "fashion",
        "customization_options": {}, "average_rating": "",
    }  # fmt: skip
    p.update(overrides)
    return p


def tiny_shop(goal_options=("black",), n: int = 23):
    raws = [raw_product(i) for i in range(n)]
    raws[0] = raw_product(
        0, name="Slim Fit Chino Pants", full_description="A slim fit chino.",
        customization_options={"Color": [{"value": "Black"}, {"value": "Khaki/Beige"}],
                               "size": [{"value": "30W x 30L"}, {"value": "32W x 32L"}]},
    )  # fmt: skip
    products = load_products(raws, {p["asin"]: {"attributes": ["slim fit"]} for p in raws})
    prices = {p["asin"]: p["pricing"][0] for p in products}
    goal = {
        "asin": "B0TEST0000", "name": "Slim Fit Chino Pants", "query": "men's pants",
        "product_category": "Clothing › Men › Pants", "instruction_text": INSTRUCTION,
        "attributes": ["slim fit"], "goal_options": list(goal_options), "price_upper": 40.0,
    }  # fmt: skip
    return MemoryStore(products, prices), ProductSearch.build(products), [goal]


def tiny_env(**kwargs) -> ShopEnv:
    store, search, goals = tiny_shop()
    return ShopEnv(store, search, goals, task_prefix="tiny", noun_tagger="heuristic", **kwargs)


def test_search_page_and_results_pages():
    env = tiny_env()
    obs, info = env.reset(seed=0)
    assert obs == f"WebShop [SEP] Instruction: [SEP] {INSTRUCTION} [SEP] Search"
    assert info["available_actions"] == ["search[<keywords>]"]
    obs, *_, info = env.step("search[Chino Pants]")
    assert obs.startswith(f"Instruction: [SEP] {INSTRUCTION} [SEP] Back to Search [SEP] Page 1 (Total results: 23) [SEP] Next > [SEP] B0TEST")
    segments = obs.split(" [SEP] ")
    asins = [s for s in segments if s.startswith("B0TEST")]
    assert len(asins) == 10
    assert "$25.99 to $32.99" in segments and "$25.99" in segments
    assert info["available_actions"][:2] == ["click[back to search]", "click[next >]"]
    assert info["available_actions"][2:] == [f"click[{a.lower()}]" for a in asins]
    obs, *_, info = env.step("click[next >]")
    assert "Page 2 (Total results: 23) [SEP] < Prev [SEP] Next >" in obs
    assert info["available_actions"][:3] == ["click[back to search]", "click[< prev]", "click[next >]"]
    env.step("click[next >]")
    obs, *_, info = env.step("click[next >]")  # past the end: "Next >" stays, the list is empty
    assert obs.endswith("Page 4 (Total results: 23) [SEP] < Prev [SEP] Next >")


def open_target(env) -> str:
    env.reset(seed=0)
    env.step("search[slim fit chino pants]")
    obs, *_ = env.step("click[b0test0000]")
    return obs


def test_item_page_text_and_clickables():
    env = tiny_env()
    obs = open_target(env)
    assert obs == (
        f"Instruction: [SEP] {INSTRUCTION} [SEP] Back to Search [SEP] < Prev [SEP] color [SEP] black [SEP] "
        "khaki | beige [SEP] size [SEP] 30w x 30l [SEP] 32w x 32l [SEP] Slim Fit Chino Pants [SEP] Price: $25.99 to "
        "$32.99 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now"
    )
    assert env.available_actions() == [
        "click[back to search]", "click[< prev]", "click[description]", "click[features]", "click[reviews]",
        "click[buy now]", "click[black]", "click[khaki | beige]", "click[30w x 30l]", "click[32w x 32l]",
    ]  # fmt: skip


def test_sub_pages_and_navigation():
    env = tiny_env()
    open_target(env)
    env.step("click[khaki | beige]")
    obs, *_, info = env.step("click[Description]")  # the argument is lower-cased, as in the original
    assert obs == f"Instruction: [SEP] {INSTRUCTION} [SEP] Back to Search [SEP] < Prev [SEP] A slim fit chino."
    assert info["available_actions"] == ["click[back to search]", "click[< prev]"]
    env.step("click[< prev]")
    obs, *_ = env.step("click[features]")
    assert obs.endswith("< Prev [SEP] Bullet 0 [SEP] More")
    env.step("click[< prev]")
    obs, *_ = env.step("click[reviews]")
    assert obs.endswith("Back to Search [SEP] < Prev")  # reviews are empty in the released data
    env.step("click[< prev]")
    assert env._session.state.options == {"color": "khaki | beige"}  # kept across sub-pages
    obs, *_ = env.step("click[< prev]")  # item -> its results page, options reset
    assert "Page 1 (Total results:" in obs and env._session.state.options == {}
    obs, *_ = env.step("click[back to search]")
    assert obs.startswith("WebShop [SEP]")


def test_invalid_clicks_keep_the_page_and_search_works_anywhere():
    env = tiny_env()
    page = open_target(env)
    obs, reward, terminated, truncated, info = env.step("click[next >]")  # not on an item page
    assert not info["action_valid"] and "not a clickable" in info["invalid_reason"]
    assert obs.startswith("Invalid action:") and obs.endswith(page) and reward == 0.0
    obs, *_, info = env.step("click[search]")
    assert not info["action_valid"]
    obs, *_, info = env.step("search[chino]")  # from an item page, as the original allows
    assert info["action_valid"] and "Page 1 (Total results:" in obs


def test_option_clicks_replace_within_a_group_and_buy_scores():
    env = tiny_env()
    open_target(env)
    env.step("click[khaki | beige]")
    env.step("click[black]")
    env.step("click[32w x 32l]")
    assert env._session.state.options == {"color": "black", "size": "32w x 32l"}
    obs, reward, terminated, truncated, info = env.step("click[buy now]")
    assert terminated and not truncated and reward == 1.0
    assert obs == "Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0"
    assert info["metrics"]["success"] == 1.0 and info["metrics"]["exact_product"] == 1.0
    assert info["reward_parts"]["num_option_matches"] == 1.0 and info["reward_parts"]["r_price"] == 1.0


def test_buying_without_the_option_scores_by_the_formula():
    env = tiny_env()
    open_target(env)
    *_, reward, terminated, _, info = env.step("click[buy now]")
    assert terminated and reward == pytest.approx(2 / 3)  # attribute + price, not the colour
    assert info["metrics"]["success"] == 0.0 and info["metrics"]["score"] == pytest.approx(2 / 3)


def test_step_budget_truncates():
    env = tiny_env()
    env.reset(seed=0)
    for i in range(15):
        _, _, terminated, truncated, info = env.step("search[chino]")
        assert not terminated and truncated == (i == 14)
    assert info["ended_by"] == "step_budget" and info["metrics"]["purchased"] == 0.0


def test_capo_reward_variant():
    env = tiny_env(reward="capo")
    open_target(env)
    _, reward, *_ = env.step("no action here")
    assert reward == pytest.approx(-0.1)
    env.step("click[black]")
    _, reward, terminated, *_ = env.step("click[buy now]")
    assert terminated and reward == 10.0


def test_score_weight_adds_the_score_to_a_failed_and_a_won_purchase():
    env = tiny_env(reward="capo", score_weight=2.0)
    open_target(env)
    _, reward, terminated, *_ = env.step("click[buy now]")  # the colour not clicked: score 2/3, no success
    assert terminated and reward == pytest.approx(2 * 2 / 3)
    open_target(env)
    env.step("click[black]")
    _, reward, *_ = env.step("click[buy now]")
    assert reward == pytest.approx(10.0 + 2.0)


@pytest.mark.parametrize("kwargs", [{"score_weight": -1.0}, {"score_weight": "2"}, {"score_weight": True},
                                    {"score_weight": 1.0, "reward": "score"}])
def test_score_weight_is_checked(kwargs):
    with pytest.raises(ValueError, match="score_weight"):
        tiny_env(**kwargs)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("search[Slim Chino]", ("search", "slim chino")),
        ("I should look. search[slim chino]", ("search", "slim chino")),
        ("click[Buy Now] trailing", ("click", "buy now")),
        ("<think>click[x]</think> click[black]", ("click", "black")),
        ("search[a] click[b]", None),
        ("search[unclosed", None),
        ("search[]", None),
        ("buy[now]", None),
        ("", None),
    ],
)
def test_plain_protocol(text, expected):
    result = WebShopProtocol(TOOLS).parse(text)
    if expected is None:
        assert not result.valid
    else:
        arg = result.action.args["keywords" if expected[0] == "search" else "value"]
        assert (result.action.name, arg) == expected


def test_tags_protocol():
    protocol = WebShopProtocol(TOOLS, action_format="tags")
    assert protocol.parse("think [SEP] <action>click[Buy Now]</action>").action.args == {"value": "buy now"}
    assert not protocol.parse("click[buy now]").valid
    assert protocol.stop_strings == ("</action>",)
    assert WebShopProtocol(TOOLS).stop_strings == ("]",)


# --- SynthShop -------------------------------------------------------------------------------------------
def test_synthshop_oracle_success_at_least_095():
    metrics = expert_metrics(gym.make("capo/SynthShop-v0", split="test"))
    assert len(metrics) == 500
    assert sum(m["success"] for m in metrics) / len(metrics) >= 0.95


def test_synthshop_oracle_with_tags_format():
    env = gym.make("capo/SynthShop-v0", split="dev", action_format="tags")
    metrics = expert_metrics(env)[:50]
    assert all(m["success"] == 1.0 for m in metrics)


def test_synthshop_is_deterministic_and_in_the_original_style():
    a, b = SynthShopEnv(seed=3, split="test"), SynthShopEnv(seed=3, split="test")
    assert a.task_ids() == b.task_ids() and [g["instruction_text"] for g in a.goals] == [g["instruction_text"] for g in b.goals]
    other = SynthShopEnv(seed=4, split="test")
    assert [g["instruction_text"] for g in other.goals] != [g["instruction_text"] for g in a.goals]
    texts = [g["instruction_text"] for g in a.goals]
    assert all(t.startswith("Find me ") for t in texts)
    assert any(" with color: " in t and ", and size: " in t for t in texts)
    assert any(t.endswith(" dollars") for t in texts)
    assert len(SynthShopEnv(seed=3, split="train").task_ids()) > 1000


def test_synthshop_checks_its_knobs():
    with pytest.raises(ValueError, match="split"):
        SynthShopEnv(split="valid")
    with pytest.raises(ValueError, match="num_products"):
        SynthShopEnv(num_products=5)
    with pytest.raises(ValueError, match="reward"):
        SynthShopEnv(reward="dense")
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="results_per_page"):
            SynthShopEnv(results_per_page=bad)


def test_synthshop_shorter_results_pages_still_hold_every_hit_and_the_oracle_wins():
    """results_per_page=3 (a CPU preset's shorter observation) shows 3 products a page, the same ranking
    paged more finely, and the oracle pages to its product as before."""
    wide, narrow = SynthShopEnv(split="dev"), SynthShopEnv(split="dev", results_per_page=3)
    wide.reset(seed=0)
    narrow.reset(seed=0)
    query = f"search[{wide.oracle_query()}]"
    wide_page, *_ = wide.step(query)
    narrow_page, *_ = narrow.step(query)
    assert narrow._session._results == wide._session._results
    shown = [asin for asin in narrow._session._results if asin in narrow_page]
    assert shown == narrow._session._results[:3] and len(narrow_page) < len(wide_page) / 2
    metrics = expert_metrics(SynthShopEnv(split="dev", results_per_page=3))[:30]
    assert all(m["success"] == 1.0 for m in metrics)


def test_synthshop_passes_gymnasiums_checker():
    env = gym.make("capo/SynthShop-v0", disable_env_checker=True)
    check_env(env.unwrapped, skip_render_check=False)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_synthshop_in_vector_envs(mode):
    fns = [lambda: gym.make("capo/SynthShop-v0") for _ in range(2)]
    envs = gym.vector.SyncVectorEnv(fns) if mode == "sync" else gym.vector.AsyncVectorEnv(fns, shared_memory=False)
    try:
        envs.reset(seed=[0, 1])
        ended = 0
        for _ in range(16):
            actions = [a if a is not None else "" for a in envs.call("expert_action")]
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            assert all(isinstance(o, str) for o in obs)
            ended += int(terminated.sum() + truncated.sum())
        assert ended >= 2
    finally:
        envs.close()


def test_webshop_without_data_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPO_DATA_DIR", str(tmp_path))
    with pytest.raises(DataNotPreparedError, match="capo data prepare webshop --size full"):
        gym.make("capo/WebShop-v0")
    with pytest.raises(DataNotPreparedError, match="--size small"):
        gym.make("capo/WebShop-v0", size="small")
    assert not capo_envs.CATALOG["capo/WebShop-v0"].data_ready()
