"""Shoal engine: placement. Pure functions: where every layer goes, whether it fits, and
how fast it will run. No I/O here; engine.placement_profiles reads the shipped profiles."""

from engine.placement.cost import Prediction
from engine.placement.memory import MemoryUse
from engine.placement.model import LinkSpec, ModelSpec, NodeSpec
from engine.placement.planner import Placement, Rank, Rejection, evaluate, explain, plan
from engine.placement.validate import NotEnoughMemory, PlacementError

__all__ = ["LinkSpec", "MemoryUse", "ModelSpec", "NodeSpec", "NotEnoughMemory", "Placement",
           "PlacementError", "Prediction", "Rank", "Rejection", "evaluate", "explain", "plan"]
