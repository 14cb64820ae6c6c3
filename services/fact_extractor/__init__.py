"""The fact extractor: curated memory operations proposed by the model for each recorded turn,
validated in code (ids, scope, duplicates, sensitive data, grounding) and applied atomically."""
