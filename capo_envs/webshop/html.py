"""WebShop's pages as HTML for people: the same strings, buttons and order as the text observations.

Every clickable is a link to ``<base>/act?a=click[...]`` and the search page has a form sending
``search[...]``, so a person's clicks go through the env exactly like an agent's actions.
"""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from .engine import BACK_TO_SEARCH, BUY_NOW, DONE, ITEM, NEXT_PAGE, PREV_PAGE, RESULTS, SEARCH, SUB, SUB_PAGES, ShopSession

STYLE = """
body{font-family:sans-serif;margin:0;background:#f4f4f4;color:#111}
header{background:#232f3e;color:#fff;padding:10px 16px}
header .instr{font-size:15px;margin-top:4px}
main{padding:16px;max-width:960px}
a.btn{display:inline-block;background:#febd69;color:#111;border-radius:4px;padding:6px 12px;margin:3px;
 text-decoration:none;border:1px solid #a88734}
a.btn.on{background:#232f3e;color:#fff}
a.product-link{font-weight:bold;color:#0066c0}
.product{background:#fff;padding:8px 12px;margin:8px 0;border-radius:4px}
.group{margin:6px 0}.title{font-size:20px;font-weight:bold;margin:10px 0}
.note{color:#555;font-size:13px}form{margin:12px 0}input[type=text]{width:60%;padding:6px;font-size:15px}
"""


def _link(base: str, action: str, label: str, cls: str = "btn") -> str:
    return f'<a class="{cls}" href="{escape(base)}/act?a={quote(action)}">{escape(label)}</a>'


def _click(base: str, label: str, selected: bool = False) -> str:
    return _link(base, f"click[{label.lower()}]", label, "btn on" if selected else "btn")


def render_page(session: ShopSession, base: str, note: str = "", footer: str = "") -> str:
    """The session's current page as a full HTML document; ``base`` is the session's URL prefix."""
    s = session.state
    body: list[str] = []
    if s.page == SEARCH:
        body.append(
            f'<form action="{escape(base)}/search" method="get"><input type="text" id="search_input" name="q" '
            f'placeholder="Search products" autofocus> <button class="btn" type="submit">Search</button></form>'
        )
    elif s.page == RESULTS:
        body.append(_click(base, BACK_TO_SEARCH))
        body.append(f"<p>Page {s.page_num} (Total results: {len(session._results)})</p>")
        if s.page_num > 1:
            body.append(_click(base, PREV_PAGE))
        body.append(_click(base, NEXT_PAGE))
        for p in session._page_products():
            link = _link(base, f"click[{p['asin'].lower()}]", p["asin"], "product-link")
            body.append(f'<div class="product">{link}<div>{escape(p["Title"])}</div><div>{escape(p["Price"])}</div></div>')
    elif s.page in (ITEM, SUB):
        p = session._product()
        body.append(_click(base, BACK_TO_SEARCH) + _click(base, PREV_PAGE))
        if s.page == ITEM:
            for name, values in p["options"].items():
                buttons = "".join(_click(base, v, s.options.get(name) == v) for v in values)
                body.append(f'<div class="group"><b>{escape(name)}</b> {buttons}</div>')
            body.append(f'<div class="title">{escape(p["Title"])}</div>')
            body.append(f"<div>Price: {escape(p['Price'])}</div><div>Rating: {escape(str(p.get('Rating', 'N.A.')))}</div>")
            body.append("".join(_click(base, b) for b in SUB_PAGES) + _click(base, BUY_NOW))
        elif s.sub_page == "Description":
            body.append(f"<p>{escape(p['Description'] or '')}</p>")
        elif s.sub_page == "Features":
            body.append("<ul>" + "".join(f"<li>{escape(b)}</li>" for b in p["BulletPoints"]) + "</ul>")
    elif s.page == DONE:
        body.append(f"<h2>Thank you for shopping with us!</h2><p>Your score (min 0.0, max 1.0)</p><p id=score>{session.reward}</p>")
    note_html = f'<p class="note" id="note">{escape(note)}</p>' if note else ""
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>WebShop</title>"
        f"<style>{STYLE}</style></head><body><header><b>WebShop</b><div class='instr'>Instruction: "
        f"{escape(session.instruction)}</div></header><main>{note_html}{''.join(body)}{footer}</main></body></html>"
    )
