"""The enricher: keeps the derived retrieval index of curated facts up to date from `memory.changes`.

The index is a rebuildable, untrusted, best-effort derivative (ZeroClaw ADR-010). The enricher
reads fact texts only — never transcripts — and nothing waits for it: a failure is logged and
dead-lettered, retrieval falls back to the authority, and a reindex rebuilds what was missed.
"""
