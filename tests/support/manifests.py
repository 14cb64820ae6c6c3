"""Deployment manifests as the tests read them: one YAML mapping, or every document of a folder."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml


@cache
def yaml_mapping(path: Path) -> dict[str, Any]:
    """The one YAML mapping in `path` (a compose file)."""
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict), f"{path.name} holds one mapping"
    return loaded


@cache
def yaml_documents(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every non-empty document of the folder's `*.yaml` files, with its file name, in name order."""
    return [
        (path.name, document)
        for path in sorted(folder.glob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if document is not None
    ]
