"""SynthHop: a generated encyclopedia of fictional entities with multi-hop questions (``build_world``)."""

from .synthhop import SIZES, SizePreset, SynthWorld, answer_is_supported, build_world, world_digest

__all__ = ["SIZES", "SizePreset", "SynthWorld", "answer_is_supported", "build_world", "world_digest"]
