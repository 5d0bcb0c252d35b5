"""arXiv identifiers: every spelling a client or a dataset uses, reduced to one canonical form.

Forms accepted (arXiv's own identifier scheme, https://info.arxiv.org/help/arxiv_identifier.html):

* new style since 2007-04: ``YYMM.NNNN`` (to 2014-12) or ``YYMM.NNNNN`` (from 2015-01), e.g. ``2309.06180``;
* old style before that: ``archive[.SUBJECT]/YYMMNNN``, e.g. ``cs/0112017``, ``math.GT/0309136``,
  ``solv-int/9901001``;
* either with a version suffix (``2309.06180v2``), an ``ARXIV:``/``arXiv:`` prefix (Semantic Scholar's id
  syntax), a ``URL:`` prefix, or as an arxiv.org ``abs``/``pdf`` link.

The canonical form is the bare id without a version. Version stripping only removes a trailing ``v<digits>``:
CAPO's ``x.split("v")[0]`` would cut old-style ids such as ``solv-int/9901001`` in two.
"""

from __future__ import annotations

import re

_NEW = re.compile(r"\d{4}\.\d{4,5}")
_OLD = re.compile(r"[a-z]+(?:-[a-z]+)*(?:\.[A-Za-z]{2})?/\d{7}")
_VERSION = re.compile(r"v\d+$")
_PREFIXES = ("arxiv:", "url:")
_URL = re.compile(r"^(?:https?://)?(?:www\.|export\.)?arxiv\.org/(?:abs|pdf|html)/(.+?)(?:\.pdf)?/?$", re.IGNORECASE)
MAX_ID_CHARS = 200


def strip_version(arxiv_id: str) -> str:
    """``2309.06180v2`` -> ``2309.06180``; ``solv-int/9901001`` is left whole."""
    return _VERSION.sub("", arxiv_id)


def normalize_arxiv_id(text: object) -> str | None:
    """The canonical bare arXiv id of ``text``, or None when it is not an arXiv id in any accepted form."""
    if not isinstance(text, str) or not text or len(text) > MAX_ID_CHARS:
        return None
    value = text.strip()
    # Prefixes may stack ("URL:https://arxiv.org/abs/..."), so strip them until none is left.
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if value.lower().startswith(prefix):
                value, changed = value[len(prefix) :].strip(), True
        match = _URL.match(value)
        if match:
            value, changed = match.group(1), True
    value = strip_version(value)
    if _NEW.fullmatch(value) or _OLD.fullmatch(value):
        return value
    return None


def is_old_style(arxiv_id: str) -> bool:
    return "/" in arxiv_id
