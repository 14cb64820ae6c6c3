"""The built-in assistant: an App written with the public API, the same shape as yours.

`quipu up` without `--app` runs this one (`quipu up --app quipu.assistant:app` is the same), and
publishes its two agents on `agents.registry` as it would publish yours. Their tools are the
shipped ones (`current_time`, `calculator`, `notes`, `ask_user`), which the default executor of
every deployment serves, so the app declares no toolset; `math_agent` is an agent-tool of
`assistant` (calling it starts a child run).

The planner knows neither these agents nor these tools of its own: it serves the agents because
they are on `agents.registry`, and offers the tools because the default executor announced them on
`tools.registry`. A deployment without `quipu up` publishes them with
`quipu agents apply quipu.assistant:app`.
"""

from __future__ import annotations

from quipu.agents import Agent
from quipu.app import App
from quipu.services.domain.shipped_tools import ask_user, calculator

math_agent = Agent(
    id="math_agent",
    description="Solves a mathematical task with a calculator and answers with the result.",
    instructions=(
        "You are a careful mathematician. Use the calculator for every computation and answer "
        "with the result and one sentence of explanation."
    ),
    tools=[calculator],
    max_steps=4,
)

assistant = Agent(
    id="assistant",
    description="A general assistant that can tell the time, calculate, keep notes and ask the user.",
    instructions=(
        "You are Quipu's assistant. Answer briefly and precisely. Use the tools when they help: "
        "current_time for the date and time, calculator for arithmetic, notes to remember or recall "
        "short notes, ask_user when you need the user's confirmation or a missing detail, and "
        "math_agent to delegate a mathematical task."
    ),
    tools=["current_time", calculator, "notes", ask_user, math_agent],
)

app = App(agents=[assistant, math_agent])
