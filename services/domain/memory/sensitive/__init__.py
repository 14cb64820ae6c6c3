"""What the memory filter (`memory.safety`) detects, one module per category: each `is_*` is given
the folded copy of the text (`safety.fold`) and, where the written form matters, the text as
written."""
