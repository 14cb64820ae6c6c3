"""The planner's pure decisions: a run's records in, the next step out.

A run is a state machine whose state is its run log. `view.RunView` folds the records into what
the decisions need (transcript, step, tool results, links, cancellation, terminal);
`decide.decide` looks at a view and names the one next step as a small typed value
(`actions`); the builders turn steps into records and topic messages. Nothing here touches a
broker, a store or a model: `orchestrator.Planner` runs the steps and feeds the records it wrote
back into the view.

Determinism is what makes redelivery harmless: every record key is derived from the run and the
step (`keys`), every record written for a message carries that message's `occurred_at`, and every
output message id is derived from the run id and the step, so a replayed trigger rewrites
identical records (exact retries) and republishes identical messages.
"""
