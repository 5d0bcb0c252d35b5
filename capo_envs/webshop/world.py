"""SynthShop: a generated catalogue in WebShop's own schema, run through the original's own pipeline.

``generate_catalog(seed, num_products)`` writes raw records as items_shuffle*.json has them (asin, name,
full_description, small_description, pricing, images, product_category, query, category,
customization_options, average_rating) and an items_ins_v2-style attribute file (attributes, instruction,
instruction_attributes). ``load_products`` and ``synthetic_goals`` then build products and goals exactly as
for the real data, so goal texts read like the original's synthetic ones:
"Find me {query} with {attr}, {attr} with color: black, and size: large, and price lower than 40.00 dollars".

Option values avoid the colour-normalisation quirk (a value whose normalised form is not one of its own
words, e.g. 'green2' -> 'green'), so buying the target with the goal's options always scores 1.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Sequence

SEP = " \u203a "


@dataclass(frozen=True)
class ProductType:
    category: str  # WebShop's 5 top-level categories
    path: str  # product_category below the department
    query: str  # the scraped search term (lower-cased at load)
    nouns: tuple[str, ...]  # head nouns for titles
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]


COLORS = ("black", "white", "navy", "red", "grey", "pink", "beige", "olive", "brown", "purple", "teal", "ivory")
SIZES = ("small", "medium", "large", "x-large", "xx-large")
TYPES: tuple[ProductType, ...] = (
    ProductType("beauty", "Beauty & Personal Care › Hair Care › Shampoos", "shampoo", ("shampoo",),
                ("sulfate free", "paraben free", "natural ingredients", "dry hair", "tea tree", "argan oil", "color safe", "cruelty free"),
                (("size", ("8 fl oz", "12 fl oz", "16 fl oz")), ("scent", ("lavender", "citrus", "unscented"))), (6, 30)),
    ProductType("beauty", "Beauty & Personal Care › Skin Care › Face › Moisturizers", "face moisturizer", ("moisturizer", "cream"),
                ("hyaluronic acid", "oil free", "sensitive skin", "fragrance free", "anti aging", "vitamin c", "long lasting", "non greasy"),
                (("size", ("1.7 ounce", "3.4 ounce")),), (9, 60)),
    ProductType("beauty", "Beauty & Personal Care › Makeup › Lips › Lipstick", "lipstick", ("lipstick",),
                ("long lasting", "matte finish", "cruelty free", "vegan", "moisturizing", "highly pigmented", "waterproof"),
                (("color", ("red", "pink", "nude", "plum", "coral")),), (5, 25)),
    ProductType("beauty", "Beauty & Personal Care › Tools & Accessories › Bags & Cases › Toiletry Bags", "toiletry bag", ("bag", "organizer"),
                ("travel size", "water resistant", "easy clean", "large capacity", "hanging hook", "zipper closure"),
                (("color", ("black", "grey", "pink", "navy")),), (8, 35)),
    ProductType("fashion", "Clothing, Shoes & Jewelry › Men › Clothing › Pants", "men's pants", ("pants", "chinos", "trousers"),
                ("slim fit", "machine wash", "stretch fabric", "button closure", "relaxed fit", "cotton spandex", "zipper fly", "classic fit"),
                (("color", ("black", "navy", "khaki", "grey", "olive")), ("size", ("30w x 30l", "32w x 30l", "34w x 32l", "36w x 32l"))), (20, 60)),
    ProductType("fashion", "Clothing, Shoes & Jewelry › Women › Clothing › Tops, Tees & Blouses", "women's tops, tees & blouses", ("blouse", "top", "tee"),
                ("short sleeve", "long sleeve", "relaxed fit", "machine wash", "button closure", "polyester spandex", "v neck", "loose fit"),
                (("color", ("white", "black", "pink", "purple", "teal")), ("size", SIZES)), (12, 40)),
    ProductType("fashion", "Clothing, Shoes & Jewelry › Women › Shoes › Sandals", "women's sandals", ("sandals", "slides"),
                ("open toe", "rubber sole", "ankle strap", "non slip", "arch support", "memory foam", "lightweight"),
                (("color", ("black", "brown", "white", "beige")), ("size", ("6", "7", "8", "9", "10"))), (18, 70)),
    ProductType("fashion", "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running", "men's running shoes", ("shoes", "sneakers"),
                ("rubber sole", "lace up", "breathable mesh", "lightweight", "arch support", "non slip", "memory foam"),
                (("color", ("black", "white", "grey", "navy")), ("size", ("8", "9", "10", "11", "12"))), (35, 120)),
    ProductType("garden", "Home & Kitchen › Furniture › Living Room Furniture › Tables › Coffee Tables", "coffee tables", ("table",),
                ("solid wood", "easy assemble", "storage space", "mid century", "living room", "metal frame", "space saving"),
                (("color", ("walnut", "black", "white", "oak")),), (60, 400)),
    ProductType("garden", "Home & Kitchen › Bedding › Sheets & Pillowcases › Sheet & Pillowcase Sets", "bed sheets", ("sheets", "sheet set"),
                ("deep pocket", "machine wash", "wrinkle free", "microfiber", "egyptian cotton", "breathable", "fade resistant"),
                (("color", ("white", "grey", "navy", "ivory", "beige")), ("size", ("twin", "full", "queen", "king"))), (20, 90)),
    ProductType("garden", "Home & Kitchen › Home Décor Products › Pillows › Throw Pillow Covers", "throw pillow covers", ("pillow covers", "cushion cases"),
                ("double sided", "machine washable", "hidden zipper", "linen", "living room", "decorative", "set of 2"),
                (("color", ("beige", "grey", "teal", "olive", "brown")), ("size", ("18 x 18 inch", "20 x 20 inch"))), (10, 35)),
    ProductType("garden", "Patio, Lawn & Garden › Outdoor Décor › Outdoor String Lights", "outdoor string lights", ("string lights", "lights"),
                ("solar powered", "waterproof", "warm white", "remote control", "dimmable", "shatterproof", "timer"),
                (("length", ("25 ft", "48 ft", "100 ft")),), (15, 60)),
    ProductType("electronics", "Electronics › Headphones, Earbuds & Accessories › Earbuds", "wireless earbuds", ("earbuds", "headphones"),
                ("noise cancelling", "bluetooth 5.0", "long battery life", "charging case", "sweat resistant", "touch control", "hands free"),
                (("color", ("black", "white", "navy")),), (20, 150)),
    ProductType("electronics", "Electronics › Computers & Accessories › Keyboards", "wireless keyboard", ("keyboard",),
                ("rechargeable battery", "quiet keys", "backlit", "compact", "bluetooth", "usb receiver", "ergonomic"),
                (("color", ("black", "white", "grey")),), (18, 90)),
    ProductType("electronics", "Electronics › Cell Phones & Accessories › Chargers › Car Chargers", "car phone charger", ("charger", "mount"),
                ("fast charging", "wireless charging", "air vent", "dashboard", "one hand operation", "usb c"),
                (("style", ("vent clip", "suction cup", "cd slot")),), (12, 45)),
    ProductType("electronics", "Electronics › Camera & Photo › Tripods & Monopods", "camera tripod", ("tripod", "stand"),
                ("lightweight", "aluminum alloy", "carrying bag", "remote shutter", "phone holder", "quick release"),
                (("size", ("50 inch", "60 inch", "72 inch")),), (15, 80)),
    ProductType("grocery", "Grocery & Gourmet Food › Snacks & Sweets › Snack Bars", "snack bars", ("bars", "snack bars"),
                ("gluten free", "high protein", "low sugar", "non gmo", "keto friendly", "plant based", "individually wrapped"),
                (("flavor name", ("chocolate chip", "peanut butter", "almond")), ("size", ("12 count", "24 count"))), (10, 40)),
    ProductType("grocery", "Grocery & Gourmet Food › Beverages › Coffee, Tea & Cocoa › Tea › Green Tea", "green tea", ("tea", "tea bags"),
                ("organic", "caffeine free", "non gmo", "individually wrapped", "loose leaf", "decaf"),
                (("size", ("20 count", "50 count", "100 count")),), (5, 30)),
    ProductType("grocery", "Grocery & Gourmet Food › Pantry Staples › Cooking & Baking › Nuts & Seeds", "almonds", ("almonds", "nuts"),
                ("roasted", "unsalted", "resealable bag", "high protein", "non gmo", "raw"),
                (("size", ("1 pound", "2 pound", "3 pound")),), (8, 40)),
    ProductType("grocery", "Grocery & Gourmet Food › Breakfast Foods › Cereals › Granola", "granola", ("granola", "clusters"),
                ("whole grain", "low sugar", "gluten free", "high fiber", "honey", "plant based"),
                (("flavor name", ("honey almond", "maple pecan", "dark chocolate")),), (5, 25)),
)  # fmt: skip
BRANDS = (
    "Vellmoor", "Quenta", "Brisko", "Lumora", "Tavik", "Orlenne", "Zephra", "Calloway", "Nimbra", "Peloric",
    "Skarde", "Ardenly", "Mirova", "Kestrel Lane", "Hollis & Co", "Varnell", "Ostera", "Jubilo", "Tessaly", "Fenwick",
)  # fmt: skip
STYLE_WORDS = ("Classic", "Premium", "Everyday", "Deluxe", "Essential", "Modern", "Original", "Signature")


def _asin(rng: random.Random, taken: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _title(rng: random.Random, brand: str, kind: ProductType, attributes: Sequence[str]) -> str:
    noun = rng.choice(kind.nouns)
    shown = " ".join(a.title() for a in attributes[:2])
    return f"{brand} {rng.choice(STYLE_WORDS)} {shown} {noun.title()}"


def _pricing(rng: random.Random, low: float, high: float) -> str:
    a = round(rng.uniform(low, high), 2)
    if rng.random() < 0.25:
        b = round(a * rng.uniform(1.1, 1.5), 2)
        return f"${a:.2f} - ${b:.2f}"  # a range, as the raw files write some prices
    return f"${a:.2f}"


def generate_catalog(seed: int, num_products: int, all_options: bool = False) -> tuple[list[dict], dict[str, dict]]:
    """(raw product records, items_ins_v2-style attributes by ASIN), deterministic in ``seed``.

    ``all_options`` (a CPU preset): every product offers every value of each of its type's option groups, so
    any product of the goal's type can be bought with the goal's options; the products are otherwise the same
    (the generator draws the same numbers)."""
    rng = random.Random(f"synthshop-{seed}")
    raw, attrs, taken = [], {}, set()
    for _ in range(num_products):
        kind = rng.choice(TYPES)
        asin = _asin(rng, taken)
        brand = rng.choice(BRANDS)
        attributes = rng.sample(kind.attributes, rng.randint(3, min(5, len(kind.attributes))))
        name = _title(rng, brand, kind, attributes)
        options = {}
        for option_name, values in kind.options:
            if rng.random() < 0.85:
                picked = sorted(rng.sample(values, rng.randint(2, len(values))), key=values.index)
                group = option_name.title() if rng.random() < 0.5 else option_name
            elif all_options:
                group = option_name
            else:
                continue
            if all_options:
                picked = list(values)
            options[group] = [{"value": v, "image": None} for v in picked]
        bullets = [f"{a.capitalize()}: made for everyday use." for a in attributes[2:]] + [f"Brand: {brand}"]
        raw.append({
            "asin": asin, "name": name, "category": kind.category, "query": kind.query.title(),
            "product_category": SEP.join([kind.path.split(" › ")[0], *kind.path.split(" › ")[1:]]),
            "full_description": f"{name}. A {kind.nouns[0]} by {brand}, {', '.join(attributes[:3])}.",
            "small_description": bullets, "pricing": _pricing(rng, *kind.price), "images": [""],
            "customization_options": options or "", "average_rating": "", "page": 1,
        })  # fmt: skip
        entry: dict = {"attributes": attributes}
        if rng.random() < 0.8:  # like items_ins_v2: not every product has an instruction
            wanted = rng.sample(attributes, rng.randint(1, min(3, len(attributes))))
            query = kind.query
            if rng.random() < 0.5:
                entry["instruction"] = f"Find me {query} with {', '.join(wanted)}"
            else:
                entry["instruction"] = f"Find me {', '.join(wanted)} {query}"
            entry["instruction_attributes"] = wanted
        attrs[asin] = entry
    return raw, attrs
