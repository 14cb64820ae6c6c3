"""The transcript recorder: two product-history rows per turn, and the rolling summary behind the window."""
