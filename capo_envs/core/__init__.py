"""The environment contract: text spaces, action protocols, the TextEnv base, registration."""

from .env import Outcome, TextEnv
from .paths import DataNotPreparedError, data_dir, dataset_dir, is_prepared
from .protocol import (
    Action,
    ActionProtocol,
    ParseResult,
    TagProtocol,
    ToolCallProtocol,
    ToolSpec,
    make_protocol,
)
from .registry import CATALOG, EnvCard, cpu_preset, register_card
from .spaces import UnicodeText

__all__ = [
    "Action",
    "ActionProtocol",
    "CATALOG",
    "DataNotPreparedError",
    "EnvCard",
    "Outcome",
    "ParseResult",
    "TagProtocol",
    "TextEnv",
    "ToolCallProtocol",
    "ToolSpec",
    "UnicodeText",
    "cpu_preset",
    "data_dir",
    "dataset_dir",
    "is_prepared",
    "make_protocol",
    "register_card",
]
