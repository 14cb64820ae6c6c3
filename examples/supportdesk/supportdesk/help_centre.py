"""The help centre as an MCP server, written with the `mcp` SDK: any MCP client can use it.

    python -m supportdesk.help_centre          # MCP over stdin/stdout

Quipu runs it as a toolset (`quipu.McpToolset("help_centre", command=[...])`, see
`supportdesk.app`): its tools are offered to the desk's agents beside the Python ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field

server = MCPServer("help_centre", instructions="The shop's help-centre articles, searchable by words.")


@dataclass(frozen=True)
class Article:
    """One help-centre article: its name, its title and its text."""

    slug: str
    title: str
    text: str


@cache
def articles() -> tuple[Article, ...]:
    """Every article shipped in `supportdesk/articles`, by name."""
    found = []
    for entry in sorted(resources.files("supportdesk").joinpath("articles").iterdir(), key=str):
        if entry.name.endswith(".md"):
            title, _, text = entry.read_text(encoding="utf-8").partition("\n")
            found.append(Article(entry.name.removesuffix(".md"), title.lstrip("# ").strip(), text.strip()))
    return tuple(found)


_WORD = re.compile(r"[a-z0-9]{3,}")
_COMMON = frozenset(
    {"the", "and", "for", "was", "are", "can", "has", "how", "what", "with", "you", "your", "from"}
)


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower())) - _COMMON


def ranked(query: str, limit: int) -> list[Article]:
    """The articles sharing the most words with `query`, best first (none when nothing is shared)."""
    wanted = _words(query)
    scored = [(len(wanted & _words(f"{article.title} {article.text}")), article) for article in articles()]
    return [article for score, article in sorted(scored, key=lambda pair: -pair[0]) if score][:limit]


@server.tool()
def search_articles(
    query: Annotated[str, Field(description="What the customer asks about, in a few words.")],
    limit: Annotated[int, Field(ge=1, le=5, description="How many articles at most.")] = 2,
) -> str:
    """Finds the help-centre articles about a customer's question and returns their text."""
    found = ranked(query, limit)
    if not found:
        titles = "; ".join(article.title for article in articles())
        return f"No article matches {query!r}. The help centre has: {titles}."
    return "\n\n".join(f"{article.title}: {article.text}" for article in found)


def main() -> None:
    """`python -m supportdesk.help_centre`: serve MCP on stdin/stdout."""
    server.run()


if __name__ == "__main__":
    main()
