"""Quipu: a distributed runtime for AI agents on typed Kafka topics, with one storage owner.

Everything installs under this one import root: the wire (`quipu.contracts`), the services
(`quipu.services.<name>`, each runnable as `quipu serve <name>`), the shared plumbing
(`quipu.services.kit`) and domain (`quipu.services.domain`), and the embedded local stack
(`quipu.deploy.local`). The names below are the stable surface: what a program that publishes run
requests and reads run events needs (`Client`, see `quipu.client`), what your own tools are
written with (`tool`, `Toolset`, `ToolContext`, `ToolError`; see `quipu.tools`), your own agents
(`Agent`, `load_agents`; see `quipu.agents`), an MCP server served as a toolset
(`McpToolset`, see `quipu.mcp`), and the `App` that puts your agents and toolsets
together for `quipu up --app` (see `quipu.app`). They load on first use, so `import quipu` stays
cheap. `quipu.testing` holds the offline models for your own tests.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quipu.agents import Agent, AgentFileError, load_agents
    from quipu.app import App, AppError, AppLoadError, load_app
    from quipu.client import Client, RunEvents, RunResult
    from quipu.contracts.events import RunEvent, RunPhase, StreamEventType
    from quipu.contracts.runs import CancelRun, RunRequested, TurnCompleted
    from quipu.contracts.topics import TOPICS, Topic, TopicSpec
    from quipu.mcp import McpOAuth, McpToolset
    from quipu.tools import (
        AwaitInput,
        AwaitKind,
        Cancellation,
        Tool,
        ToolArguments,
        ToolContext,
        ToolError,
        Toolset,
        tool,
    )

__version__ = "0.1.0"

_PUBLIC: dict[str, str] = {
    "Agent": "quipu.agents",
    "AgentFileError": "quipu.agents",
    "load_agents": "quipu.agents",
    "App": "quipu.app",
    "AppError": "quipu.app",
    "AppLoadError": "quipu.app",
    "load_app": "quipu.app",
    "Client": "quipu.client",
    "RunEvents": "quipu.client",
    "RunResult": "quipu.client",
    "RunRequested": "quipu.contracts.runs",
    "CancelRun": "quipu.contracts.runs",
    "TurnCompleted": "quipu.contracts.runs",
    "RunEvent": "quipu.contracts.events",
    "RunPhase": "quipu.contracts.events",
    "StreamEventType": "quipu.contracts.events",
    "Topic": "quipu.contracts.topics",
    "TopicSpec": "quipu.contracts.topics",
    "TOPICS": "quipu.contracts.topics",
    "tool": "quipu.tools",
    "Tool": "quipu.tools",
    "Toolset": "quipu.tools",
    "ToolArguments": "quipu.tools",
    "ToolContext": "quipu.tools",
    "ToolError": "quipu.tools",
    "Cancellation": "quipu.tools",
    "AwaitInput": "quipu.tools",
    "AwaitKind": "quipu.tools",
    "McpToolset": "quipu.mcp",
    "McpOAuth": "quipu.mcp",
}

__all__ = ["TOPICS", "Agent", "AgentFileError", "App", "AppError", "AppLoadError", "AwaitInput", "AwaitKind",
           "CancelRun", "Cancellation", "Client", "McpOAuth", "McpToolset",
           "RunEvent", "RunEvents", "RunPhase", "RunRequested",
           "RunResult", "StreamEventType", "Tool", "ToolArguments", "ToolContext", "ToolError", "Toolset",
           "Topic", "TopicSpec", "TurnCompleted", "__version__", "load_agents", "load_app", "tool"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'quipu' has no attribute {name!r}")
    return getattr(import_module(module), name)
