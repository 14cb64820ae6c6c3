"""A shop's support desk, built on Quipu's public API as a user's own project.

- `supportdesk.tickets`: the `tickets` toolset; `open_ticket` writes to a ledger keyed by the call's
  idempotency key, so a redelivered call opens one ticket.
- `supportdesk.status`: the `status` toolset; `service_status` asks the shop's status page over
  HTTP (a slow network call that keeps to its deadline).
- `supportdesk.help_centre`: an MCP server (the `mcp` SDK) of help-centre articles, run as a
  Quipu toolset.
- `supportdesk.status_page`: a stand-in status page to try the desk on one machine.
- `supportdesk.settings`: where the ledger is and where the status page answers (`SUPPORTDESK_...`).
"""
