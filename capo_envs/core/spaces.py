"""A text space that accepts any Unicode string up to a declared length.

Gymnasium's ``spaces.Text`` checks membership against a finite charset (alphanumeric by default), so an
observation with a space or an accent in it is "not in" the space.  Text environments need the opposite:
any string of bounded length is a legal observation or action; what it *means* is the parser's business.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

# What ``sample()`` draws from: enough scripts, whitespace, markup and symbols to exercise a parser.
SAMPLE_CHARSET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    " \n\t.,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`"
    "àéîõüçñßøåæœ"
    "αβγδλπΩЖжщ"
    "中文字符日本語한국어"
    "עברית" "العربية"
    "😀🚀✓→∑∞"
)


class UnicodeText(spaces.Text):
    """Strings of ``min_length`` to ``max_length`` characters, any Unicode code point allowed."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        super().__init__(max_length=max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        # The real type and str's own __len__: a str subclass may override __len__ (or spoof __class__).
        return issubclass(type(x), str) and self.min_length <= str.__len__(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )
