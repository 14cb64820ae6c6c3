"""The one helper every detector's patterns are built with: a regex alternation of words."""

from __future__ import annotations


def words(*alternatives: str) -> str:
    return r"(?:" + "|".join(alternatives) + r")"
