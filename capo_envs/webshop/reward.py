"""WebShop's purchase reward, computed exactly as the original ``get_reward`` does, quirks included.

Source: princeton-nlp/WebShop web_agent_site/engine/goal.py (``get_type_reward``, ``get_attribute_reward``,
``get_option_reward``, ``get_reward``) and engine/normalize.py (``COLOR_SET``, ``normalize_color``).

    R = r_type * (N_att + N_opt + [price <= price_upper]) / (|attributes| + |goal_options| + 1)

Quirks kept on purpose (each is tested in tests/test_webshop_reward.py):

* fuzzy matches use thefuzz's ``token_set_ratio`` with a strict ``> 85``; 'x-large' vs 'large' scores 100;
* an unmatched goal attribute still counts if it is a case-sensitive substring of the lower-cased title,
  joined bullet points or description;
* ``normalize_color`` returns the first ``COLOR_SET`` word that is a substring ('navy blue' -> 'blue',
  'tank' -> 'tan'); for synthetic goals (``goal_options`` a dict) the original passes ``.items()``, so
  each goal option is a ``(name, value)`` tuple that ``normalize_color`` tests by tuple membership and
  thefuzz stringifies;
* the type score divides by the *list* length of the goal name's nouns (duplicates count) and is 0.2 when
  that list is empty; its rules apply in order, so the title rules override the query/category rule;
* the option's own price is ignored: ``price`` is the product's price fixed at load time.

Where the original raises (a goal without attributes divides by zero; a non-positive ``price_upper`` makes
``r_price`` None and the sum fails) this module raises ``ValueError`` naming the problem.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from .nouns import NounTagger, get_tagger

# WebShop engine/normalize.py, in its order (the first substring hit wins, so the order matters).
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue", "blush",
    "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cheetah",
    "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream",
    "crystal", "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape",
    "graphite", "grass", "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender",
    "lemon", "leopard", "light", "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint",
    "mocha", "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive", "orange", "peach",
    "pewter", "pink", "plum", "purple", "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire",
    "seashell", "silver", "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)  # fmt: skip
FUZZY_THRESHOLD = 85  # a match needs token_set_ratio strictly above this
CATEGORY_SEPARATOR = "\u203a"  # '›' in product_category

PRODUCT_KEYS = ("name", "query", "product_category", "Title", "BulletPoints", "Description", "Attributes")
GOAL_KEYS = ("name", "query", "product_category", "attributes", "goal_options", "price_upper")


def normalize_color(option: Any) -> Any:
    """The first ``COLOR_SET`` word found in ``option`` (``in``: substring for a str, membership for a
    tuple), else ``option`` unchanged."""
    for color in COLOR_SET:
        if color in option:
            return color
    return option


def token_set_ratio(a: Any, b: Any) -> int:
    from thefuzz import fuzz

    return fuzz.token_set_ratio(a, b)


def type_reward(purchased_product: Mapping, goal: Mapping, tagger: NounTagger) -> dict[str, Any]:
    """``get_type_reward``: is the purchase the same kind of product (query, category, title nouns)?"""
    query_match = purchased_product["query"] == goal["query"]
    purchased_category = {x.strip() for x in purchased_product["product_category"].split(CATEGORY_SEPARATOR)}
    goal_category = {x.strip() for x in goal["product_category"].split(CATEGORY_SEPARATOR)}
    category_match = len(purchased_category & goal_category) >= 2

    purchased_nouns = list(tagger(purchased_product["name"]))
    desired_nouns = list(tagger(goal["name"]))
    if len(desired_nouns) == 0:
        title_score = 0.2
    else:
        title_score = len(set(purchased_nouns) & set(desired_nouns)) / len(desired_nouns)

    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def attribute_reward(purchased_product: Mapping, goal: Mapping) -> tuple[float, int]:
    """``get_attribute_reward``: (fraction, count) of goal attributes found in the purchase."""
    goal_attrs = goal["attributes"]
    title = purchased_product["Title"].lower()
    bullets = " ".join(purchased_product["BulletPoints"]).lower()
    description = purchased_product["Description"].lower()
    matches = 0
    for g_attr in goal_attrs:
        matched = any(token_set_ratio(p_attr, g_attr) > FUZZY_THRESHOLD for p_attr in purchased_product["Attributes"])
        if not matched and (g_attr in title or g_attr in bullets or g_attr in description):
            matched = True
        matches += matched
    return matches / len(goal_attrs), matches


def option_reward(purchased_options: Iterable[Any], goal_options: Iterable[Any]) -> tuple[float | None, int]:
    """``get_option_reward``: (fraction or None when there are no goal options, count) of goal options
    that some selected value matches after colour normalisation."""
    purchased = [normalize_color(o) for o in purchased_options]
    goals = [normalize_color(o) for o in goal_options]
    matches = 0
    for g_option in goals:
        for p_option in purchased:
            if token_set_ratio(p_option, g_option) > FUZZY_THRESHOLD:
                matches += 1
                break
    return (matches / len(goals) if goals else None), matches


def _check(purchased_product: Any, goal: Any, price: Any, options: Any) -> None:
    if not isinstance(purchased_product, Mapping) or not isinstance(goal, Mapping):
        raise TypeError("purchased_product and goal must be dicts (load_products' and the goal builder's layouts)")
    missing = [k for k in PRODUCT_KEYS if k not in purchased_product]
    if missing:
        raise ValueError(f"purchased_product lacks {missing} (the keys load_products adds)")
    missing = [k for k in GOAL_KEYS if k not in goal]
    if missing:
        raise ValueError(f"goal lacks {missing}")
    if purchased_product["Description"] is None:
        raise ValueError("purchased_product['Description'] is None; the original calls .lower() on it")
    if not goal["attributes"]:
        raise ValueError("the goal has no attributes; the original divides by their number (ZeroDivisionError)")
    upper = goal["price_upper"]
    if isinstance(upper, bool) or not isinstance(upper, (int, float)) or not upper > 0:
        raise ValueError(f"goal['price_upper'] must be a positive number, got {upper!r} (the original fails on it)")
    if isinstance(price, bool) or not isinstance(price, (int, float)):
        raise ValueError(f"price must be a number, got {price!r}")
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a dict {{option name: value}}, got {type(options).__name__}")


def score_purchase(
    purchased_product: Mapping, goal: Mapping, price: float, options: Mapping[str, str], *, tagger: NounTagger | None = None
) -> dict[str, Any]:
    """WebShop's reward for buying ``purchased_product`` at ``price`` with ``options`` selected, for ``goal``.

    ``purchased_product``: a product as ``load_products`` builds it; ``goal``: as ``get_human_goals`` or
    ``get_synthetic_goals`` builds it (``goal_options`` a list of str or a dict); ``price``: the product's
    price (``product_prices[asin]``); ``options``: ``{option name: selected value}``. ``tagger``: the noun
    tagger (default: spaCy's small English model if installed, see ``nouns.py``).

    Returns ``total_reward`` and its parts: ``r_type``, ``query_match``, ``category_match``, ``title_score``,
    ``r_att``, ``num_attr_matches``, ``r_option`` (None without goal options, as in the original),
    ``num_option_matches``, ``r_price`` (bool), and the weights ``w_att``, ``w_option``, ``w_price``.
    """
    _check(purchased_product, goal, price, options)
    tagger = tagger or get_tagger("auto")
    type_parts = type_reward(purchased_product, goal, tagger)
    r_price = price <= goal["price_upper"]
    r_att, num_attr_matches = attribute_reward(purchased_product, goal)
    goal_options = goal["goal_options"]
    r_option, num_option_matches = option_reward(
        list(options.values()), goal_options.items() if isinstance(goal_options, dict) else goal_options
    )
    denominator = len(goal["attributes"]) + len(goal_options) + 1
    total = (num_attr_matches + num_option_matches + r_price) / denominator
    total *= type_parts["r_type"]
    return {
        "total_reward": total,
        **type_parts,
        "r_att": r_att,
        "num_attr_matches": num_attr_matches,
        "r_option": r_option,
        "num_option_matches": num_option_matches,
        "r_price": r_price,
        "w_att": len(goal["attributes"]) / denominator,
        "w_option": len(goal_options) / denominator,
        "w_price": 1 / denominator,
    }


def is_success(total_reward: float) -> bool:
    """Success as the original's baselines count it: ``reward == 1``."""
    return total_reward == 1.0
