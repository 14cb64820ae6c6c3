"""The tool executor: runs the tool calls of `tools.calls` and answers each on `tools.results`."""
