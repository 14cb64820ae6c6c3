"""What a user or contributor reads is in the repository: no file cites a path outside it, and
every link between the README and docs/ leads to a file that exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ("../" + "shared", "/work/" + "shared")
"""Where the team's private notes live: no user has them (spelled apart so this file does not match)."""


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in listed.stdout.splitlines() if (ROOT / name).is_file()]


def test_no_tracked_file_cites_a_path_outside_the_repository() -> None:
    citing = [
        str(path.relative_to(ROOT))
        for path in tracked_files()
        if any(outside in path.read_text(encoding="utf-8", errors="ignore") for outside in OUTSIDE)
    ]
    assert citing == []


def test_the_readme_and_docs_link_only_to_files_that_exist() -> None:
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    names = {path.name for path in documents}
    assert {"architecture.md", "store-contract.md", "operations.md", "wire.md"} <= names
    for document in documents:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", document.read_text(encoding="utf-8")):
            if "://" in target:
                continue
            assert (document.parent / target).exists(), f"{document.name} links to a missing {target}"
