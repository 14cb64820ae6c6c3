"""The domain several services share: the store rules (STORE_CONTRACT), the memory rules, model ports and
adapters, the transcript model functions, the agent and tool catalogs. No broker or database I/O here:
that is the kit (plumbing) and the storage owner."""
