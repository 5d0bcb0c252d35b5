"""WebShop's pages and buttons as a state machine, rendered in the original's simple text mode.

The original's rules (princeton-nlp/WebShop web_agent_site/envs/web_agent_text_env.py, engine/engine.py,
templates/*.html):

* pages: search (start), results (10 per page, "Next >" always, "< Prev" from page 2), item (option
  groups, title, price, rating, "Description" / "Features" / "Reviews" / "Buy Now"), sub-pages
  (description, features, reviews: "Back to Search" and "< Prev" only) and done;
* the observation is the page's visible strings, stripped, empty ones dropped, joined by " [SEP] ";
* clickables are the lower-cased buttons and ASIN links plus the option values; ``search[...]`` works from
  any page (the text env does not check the search bar), ``click[x]`` only when x is clickable;
* "Back to Search" resets keywords, ASIN and options; "< Prev" on an item returns to its results page (the
  options are reset), on a sub-page to the item (options kept); clicking an option value sets that group.

Deviation: the done page shows only the thanks and the score (the original also shows an MTurk code and
the purchase details).

``option_handles=True`` (a CPU preset, not the original): the item page names its option values by short
handles, ``o1 black``, ``o2 beige``, numbered across the groups in page order, and ``click[o2]`` (or the segment,
``click[o2 beige]``) sets that value (the value alone is then not a clickable): a small model copies a 2-token
handle where it miscopies values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .shop import ProductSearch, ProductStore

PRODUCT_WINDOW = 10
SEP = " [SEP] "
BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE, BUY_NOW = "Back to Search", "Next >", "< Prev", "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews")

SEARCH, RESULTS, ITEM, SUB, DONE = "search", "results", "item", "sub", "done"


@dataclass
class Purchase:
    asin: str
    options: dict[str, str]
    price: float


@dataclass
class PageState:
    page: str = SEARCH
    keywords: list[str] = field(default_factory=list)
    page_num: int = 1
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    sub_page: str | None = None


class ShopSession:
    """One shopper's session for one goal: ``search(keywords)``, ``click(target)``, ``observation()``.

    ``score(purchase) -> float`` is called on "Buy Now"; the session then shows the done page.
    """

    def __init__(self, store: ProductStore, search: ProductSearch, instruction: str, score: Callable[[Purchase], float],
                 results_per_page: int = PRODUCT_WINDOW, option_handles: bool = False):
        self.store = store
        self.results_per_page = results_per_page
        self.option_handles = option_handles
        self.engine = search
        self.instruction = instruction
        self._score = score
        self.state = PageState()
        self._results: list[str] = []
        self._results_key: tuple[str, ...] | None = None
        self.purchase: Purchase | None = None
        self.reward = 0.0

    # --- what is on the page ---------------------------------------------------------------------------
    def option_entries(self) -> list[tuple[str, str, str]]:
        """``(clickable, group, value)`` for each option value of the item page, in page order; the clickable
        is the value, or with ``option_handles`` its handle (``o1``, ``o2``, ...)."""
        groups = self._product()["options"].items()
        entries = [(name, value) for name, values in groups for value in values]
        if self.option_handles:
            return [(f"o{i}", name, value) for i, (name, value) in enumerate(entries, 1)]
        return [(value, name, value) for name, value in entries]

    def option_clickable(self, group: str, value: str) -> str:
        """What ``click[...]`` names to set ``group`` to ``value`` on this item page."""
        for clickable, name, entry_value in self.option_entries():
            if name == group and entry_value == value:
                return clickable
        return value

    def resolve_click(self, target: str) -> str:
        """The clickable ``click[target]`` names: with ``option_handles`` a whole option segment as the page shows
        it (``o2 navy``, as WebShop's text pages make each [SEP] segment a clickable's text) names its handle."""
        if self.option_handles and self.state.page == ITEM:
            shown = " ".join(target.split()).lower()
            for clickable, _, value in self.option_entries():
                if shown == f"{clickable} {value}".lower():
                    return clickable
        return target

    def has_search_bar(self) -> bool:
        return self.state.page == SEARCH

    def _page_products(self) -> list[dict]:
        start = (self.state.page_num - 1) * self.results_per_page
        asins = self._results[start : start + self.results_per_page]
        return [p for p in (self.store.get(a) for a in asins) if p is not None]

    def _product(self) -> dict:
        product = self.store.get(self.state.asin or "")
        if product is None:  # only reachable with a store that lost a product after search
            raise KeyError(f"product {self.state.asin} is not in the store")
        return product

    def clickables(self) -> list[str]:
        s = self.state
        if s.page == SEARCH:
            return ["search"]
        if s.page == RESULTS:
            buttons = [BACK_TO_SEARCH] + ([PREV_PAGE] if s.page_num > 1 else []) + [NEXT_PAGE]
            return [b.lower() for b in buttons] + [p["asin"].lower() for p in self._page_products()]
        if s.page == ITEM:
            buttons = [BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES, BUY_NOW]
            return [b.lower() for b in buttons] + [clickable for clickable, _, _ in self.option_entries()]
        if s.page == SUB:
            return [BACK_TO_SEARCH.lower(), PREV_PAGE.lower()]
        return []

    def observation(self) -> str:
        s = self.state
        head = ["Instruction:", self.instruction]
        if s.page == SEARCH:
            parts = ["WebShop", *head, "Search"]
        elif s.page == RESULTS:
            parts = [*head, BACK_TO_SEARCH, f"Page {s.page_num} (Total results: {len(self._results)})"]
            parts += ([PREV_PAGE] if s.page_num > 1 else []) + [NEXT_PAGE]
            for p in self._page_products():
                parts += [p["asin"], p["Title"], p["Price"]]
        elif s.page == ITEM:
            p = self._product()
            parts = [*head, BACK_TO_SEARCH, PREV_PAGE]
            handles = iter(self.option_entries())
            for name, values in p["options"].items():
                parts += [name, *(f"{next(handles)[0]} {value}" if self.option_handles else value for value in values)]
            parts += [p["Title"], f"Price: {p['Price']}", f"Rating: {p.get('Rating', 'N.A.')}", *SUB_PAGES, BUY_NOW]
        elif s.page == SUB:
            p = self._product()
            parts = [*head, BACK_TO_SEARCH, PREV_PAGE]
            if s.sub_page == "Description":
                parts.append(p["Description"] or "")
            elif s.sub_page == "Features":
                parts += list(p["BulletPoints"])
        else:
            parts = ["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", str(self.reward)]
        return SEP.join(t for t in (str(x).strip() for x in parts) if t)

    # --- actions ---------------------------------------------------------------------------------------
    def why_not(self, name: str, arg: str) -> str | None:
        """Why ``name[arg]`` does nothing here (the original then returns the same page), or None."""
        if self.state.page == DONE:
            return "the purchase is done"
        if name == "search":
            return None if arg.strip() else "search needs keywords"
        if name != "click":
            return f"unknown action {name!r}; use search[...] or click[...]"
        if arg == "search" or self.resolve_click(arg) not in self.clickables():
            return f"{arg[:60]!r} is not a clickable on this page"
        return None

    def search(self, keywords: str) -> None:
        s = self.state
        self.state = PageState(page=RESULTS, keywords=keywords.split(" "), page_num=1)
        del s
        self._run_search()

    def _run_search(self) -> None:
        key = tuple(self.state.keywords)
        if key != self._results_key:
            self._results = self.engine.search(self.state.keywords)
            self._results_key = key

    def click(self, target: str) -> float:
        """Apply a valid click; returns the reward (non-zero only for "buy now")."""
        s, target = self.state, self.resolve_click(target)
        if target == BACK_TO_SEARCH.lower():
            self.state = PageState()
        elif s.page == RESULTS and target == NEXT_PAGE.lower():
            s.page_num += 1
        elif s.page == RESULTS and target == PREV_PAGE.lower():
            s.page_num -= 1
        elif s.page == RESULTS:  # an ASIN link
            s.page, s.asin, s.options = ITEM, target.upper(), {}
        elif s.page == ITEM and target == PREV_PAGE.lower():
            s.page, s.asin, s.options = RESULTS, None, {}
        elif s.page == ITEM and target == BUY_NOW.lower():
            self.purchase = Purchase(s.asin or "", dict(s.options), self.store.price(s.asin or ""))
            self.reward = float(self._score(self.purchase))
            s.page = DONE
            return self.reward
        elif s.page == ITEM and target in [b.lower() for b in SUB_PAGES]:
            s.page, s.sub_page = SUB, next(b for b in SUB_PAGES if b.lower() == target)
        elif s.page == ITEM:  # an option value (or its handle): set its group
            for clickable, name, value in self.option_entries():
                if target == clickable:
                    s.options[name] = value
                    break
        elif s.page == SUB and target == PREV_PAGE.lower():
            s.page, s.sub_page = ITEM, None
        return 0.0

    def snapshot(self) -> Mapping[str, Any]:
        s = self.state
        return {"page": s.page, "keywords": " ".join(s.keywords), "page_num": s.page_num, "asin": s.asin or "",
                "options": dict(s.options)}  # fmt: skip
