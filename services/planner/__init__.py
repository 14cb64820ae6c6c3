"""The planner: the agent loop (context, model calls, tool dispatch, resume, terminal states)."""
