"""A local emulator of the Anthropic Messages API that bills by the documented cache rules."""

from ._binding import ThinkingRules
from ._emulator_http import Emulator
from ._request_handling import CLOCK_HEADER, EmulatorCore, FaultConfig, HttpReply
from .responders import ReplayResponder, Reply, Responder, ScriptedResponder, SummarizingResponder, fill_schema

__all__ = [
    "CLOCK_HEADER",
    "Emulator",
    "EmulatorCore",
    "FaultConfig",
    "HttpReply",
    "ReplayResponder",
    "Reply",
    "Responder",
    "ScriptedResponder",
    "SummarizingResponder",
    "ThinkingRules",
    "fill_schema",
]
