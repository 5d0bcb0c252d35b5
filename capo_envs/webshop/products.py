"""Products, prices and goals in the original WebShop layouts, built by the original's rules.

Sources (princeton-nlp/WebShop): web_agent_site/engine/engine.py ``load_products``,
``generate_product_prices``; engine/goal.py ``get_human_goals``, ``get_synthetic_goals``;
web_agent_site/envs/web_agent_text_env.py (``random.seed(233); random.shuffle(goals)``);
search_engine/convert_product_file_format.py (the text that is indexed).

Reproducibility: the original draws ranged prices (``random.uniform``) and price bounds
(``random.sample``) from the *unseeded* global ``random`` at load time. Here both come, in the original's
order, from one ``random.Random(price_seed)`` (default ``PRICE_SEED``), so a run equals the original run
after ``random.seed(PRICE_SEED)``; the goal shuffle keeps the original's fixed seed 233.
"""

from __future__ import annotations

import itertools
import random
import re
from decimal import Decimal
from typing import Any, Iterable, Mapping, Sequence

PRICE_SEED = 0
SHUFFLE_SEED = 233
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
MISSING_PRICE = 100.0
NO_PRICE_BOUND = 1000000
# The canonical split of the shuffled human goals (WS baseline_models/env.py, train_*_il.py).
SPLIT_RANGES = {"test": (0, 500), "dev": (500, 1500), "train": (1500, None)}
# Fields load_products deletes (clean_product_keys).
DROPPED_KEYS = (
    "product_information", "brand", "brand_url", "list_price", "availability_quantity", "availability_status",
    "total_reviews", "total_answered_questions", "seller_id", "seller_name", "fulfilled_by_amazon",
    "fast_track_message", "aplus_present", "small_description_old",
)  # fmt: skip


def parse_pricing(pricing: Any) -> tuple[list[float], str]:
    """The original's price parsing: every '$'-separated amount with non-digits stripped; a missing price is
    100.0 shown as '$100.0'; a range keeps its first two amounts and shows '$a to $b'."""
    if pricing is None or not pricing:
        return [MISSING_PRICE], "$100.0"
    amounts = [float(Decimal(re.sub(r"[^\d.]", "", part))) for part in pricing.split("$")[1:]]
    if len(amounts) == 1:
        return amounts, f"${amounts[0]}"
    return amounts[:2], f"${amounts[0]} to ${amounts[1]}"


def load_products(
    raw_products: Iterable[Mapping],
    attributes: Mapping[str, Mapping] | None = None,
    human_instructions: Mapping[str, list] | None = None,
    *,
    human_goals: bool = True,
    num_products: int | None = None,
) -> list[dict]:
    """``load_products`` on already-read records of items_shuffle*.json (reviews are empty, as in the
    released data: the original's review loading is commented out, so Rating is 'N.A.').

    ``attributes``: items_ins_v2*.json; ``human_instructions``: items_human_ins.json (human goals only).
    """
    attributes = attributes or {}
    products, seen = [], set()
    for i, raw in enumerate(raw_products):
        if num_products is not None and i >= num_products:
            break
        asin = raw["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        p = {k: v for k, v in raw.items() if k not in DROPPED_KEYS}
        p["Title"] = p["name"]
        p["Description"] = p["full_description"]
        p["Reviews"] = []
        p["Rating"] = "N.A."
        small = p["small_description"]
        p["BulletPoints"] = small if isinstance(small, list) else [small]
        p["pricing"], p["Price"] = parse_pricing(p.get("pricing"))
        options: dict[str, list[str]] = {}
        option_to_image: dict[str, Any] = {}
        for name, contents in (p.get("customization_options") or {}).items():
            if contents is None:
                continue
            values = []
            for content in contents:
                value = content["value"].strip().replace("/", " | ").lower()
                values.append(value)
                option_to_image[value] = content.get("image", None)
            options[name.lower()] = values
        p["options"], p["option_to_image"] = options, option_to_image
        entry = attributes.get(asin)
        p["Attributes"] = entry["attributes"] if entry and "attributes" in entry else ["DUMMY_ATTR"]
        if human_goals:
            if human_instructions and asin in human_instructions:
                p["instructions"] = human_instructions[asin]
        else:
            p["instruction_text"] = attributes[asin].get("instruction", None)
            p["instruction_attributes"] = attributes[asin].get("instruction_attributes", None)
        images = p.get("images") or [None]
        p["MainImage"] = images[0]
        p["query"] = p["query"].lower().strip()
        products.append(p)
    return products


def product_prices(products: Sequence[Mapping], rng: random.Random) -> dict[str, float]:
    """``generate_product_prices``: a single price as is, a range drawn uniformly (from ``rng``)."""
    prices = {}
    for p in products:
        pricing = p["pricing"]
        if not pricing:
            price = MISSING_PRICE
        elif len(pricing) == 1:
            price = pricing[0]
        else:
            price = rng.uniform(*pricing[:2])
        prices[p["asin"]] = price
    return prices


def price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """The goal's ``price_upper`` and instruction suffix: the larger of 2 of the first 4 multiples of 10
    above the price; none (1,000,000 and no text) when fewer than 2 remain."""
    candidates = [p for p in PRICE_RANGE if p > price][:4]
    if len(candidates) >= 2:
        _, upper = sorted(rng.sample(candidates, 2))
        return upper, f", and price lower than {upper:.2f} dollars"
    return NO_PRICE_BOUND, ""


def human_goals(products: Sequence[Mapping], prices: Mapping[str, float], rng: random.Random) -> tuple[list[dict], int]:
    """``get_human_goals``: one goal per human instruction record with attributes; returns (goals, skipped)."""
    goals, skipped = [], 0
    for item in products:
        for record in item.get("instructions", ()):
            attrs = record["instruction_attributes"]
            if len(attrs) == 0:
                skipped += 1
                continue
            upper, price_text = price_bound(prices[item["asin"]], rng)
            goals.append({
                "asin": item["asin"], "category": item["category"], "query": item["query"], "name": item["name"],
                "product_category": item["product_category"],
                "instruction_text": record["instruction"].strip(".") + price_text,
                "attributes": attrs, "price_upper": upper, "goal_options": record["instruction_options"],
                "weight": 1,
            })  # fmt: skip
    return goals, skipped


def synthetic_goals(products: Sequence[Mapping], prices: Mapping[str, float], rng: random.Random) -> list[dict]:
    """``get_synthetic_goals``: one goal per combination of the product's option values (names sorted)."""
    goals: list[dict] = []
    counts: dict[str, int] = {}
    for product in products:
        if product.get("instruction_text") is None:
            continue
        attrs = product["instruction_attributes"]
        if not attrs:
            raise ValueError(f"product {product['asin']} has an instruction but no instruction_attributes")
        upper, price_text = price_bound(prices[product["asin"]], rng)
        names = sorted(product["options"])
        for combination in itertools.product(*(product["options"][n] for n in names)):
            goal_options = dict(zip(names, combination))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append({
                "asin": product["asin"], "category": product["category"], "query": product["query"],
                "product_category": product["product_category"],
                "instruction_text": f"{product['instruction_text']}{option_text}{price_text}",
                "attributes": attrs, "price_upper": upper, "goal_options": goal_options,
                "name": product["Title"],
            })  # fmt: skip
            for a in attrs:
                counts[a] = counts.get(a, 0) + 1
    for goal in goals:
        goal["weight"] = sum(1.0 / counts[a] for a in goal["attributes"]) / len(goal["attributes"])
    return goals


def shuffle_goals(goals: list[dict], seed: int = SHUFFLE_SEED) -> list[dict]:
    """The original's ``random.seed(233); random.shuffle(goals)``: the permutation depends only on the seed
    and the number of goals."""
    random.Random(seed).shuffle(goals)
    return goals


def split_goals(goals: Sequence[dict], split: str) -> Sequence[dict]:
    """The canonical split of the shuffled human goals: test = [0, 500), dev = [500, 1500), train = rest."""
    if split not in SPLIT_RANGES:
        raise ValueError(f"split must be one of {sorted(SPLIT_RANGES)}, got {split!r}")
    start, end = SPLIT_RANGES[split]
    return goals[start:end]


def build_goals(
    products: Sequence[Mapping], *, human: bool, price_seed: int = PRICE_SEED
) -> tuple[dict[str, float], list[dict]]:
    """Prices and shuffled goals exactly as the original text env builds them, after ``random.seed(price_seed)``."""
    rng = random.Random(price_seed)
    prices = product_prices(products, rng)
    goals = human_goals(products, prices, rng)[0] if human else synthetic_goals(products, prices, rng)
    return prices, shuffle_goals(goals)


def option_text(options: Mapping[str, Sequence[str]]) -> str:
    return ", and ".join(f"{name}: {', '.join(values)}" for name, values in options.items())


def search_text(product: Mapping) -> str:
    """The text the original indexes: title, description, first bullet and options, lower-cased."""
    bullets = product["BulletPoints"]
    return " ".join([
        product["Title"] or "", product["Description"] or "", (bullets[0] if bullets else "") or "",
        option_text(product["options"]),
    ]).lower()  # fmt: skip


def human_goal_check_text(instruction_text: str) -> str:
    """A goal's instruction in the form of WS baseline_models/data/human_goals.json: lower-cased, without the
    price suffix, apostrophes and double quotes."""
    text = re.sub(r", and price lower than \d+\.\d\d dollars$", "", instruction_text)
    return text.lower().replace("'", "").replace('"', "")
