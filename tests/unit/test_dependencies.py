"""Everything the installed package imports is installed with it: a library the code imports is one
of Quipu's dependencies (or theirs), never only a dev extra that a user's virtualenv lacks.

(`tests/e2e/test_own_project.py` proves it in a fresh virtualenv; this finds the same defect in a
second, naming the import.)
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPOSITORY = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = ("quipu", "contracts", "services", "deploy")
"""What the wheel installs (the last three under `quipu/`)."""


def installed_with_quipu() -> set[str]:
    """The distributions a plain `pip install quipu` brings on this platform: its dependencies, theirs
    (with the extras asked for), and so on."""
    pyproject = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
    waiting = [(Requirement(each), "") for each in pyproject["project"]["dependencies"]]
    found: set[tuple[str, str]] = set()  # (distribution, one of its extras or "")
    while waiting:
        requirement, asked_by = waiting.pop()  # asked_by: the extra of the distribution that needs it
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": asked_by}):
            continue
        name = canonicalize_name(requirement.name)
        for extra in ("", *requirement.extras):
            if (name, extra) not in found:
                found.add((name, extra))
                waiting += [(Requirement(each), extra) for each in metadata.requires(name) or []]
    return {name for name, _ in found}


def imported_libraries() -> dict[str, str]:
    """Each top-level module the package's code imports from outside it, with a file that does."""
    imported: dict[str, str] = {}
    for folder in PACKAGE_FOLDERS:
        for path in sorted((REPOSITORY / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    roots = [alias.name.split(".")[0] for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    roots = [node.module.split(".")[0]]
                else:
                    continue
                for root in roots:
                    imported.setdefault(root, str(path.relative_to(REPOSITORY)))
    return {
        root: where
        for root, where in imported.items()
        if root not in sys.stdlib_module_names and root not in {"quipu", "__future__", "_typeshed"}
    }


def test_every_library_the_package_imports_comes_with_it() -> None:
    distributions = metadata.packages_distributions()
    installed = installed_with_quipu()
    missing = {
        f"{root} (imported by {where})"
        for root, where in imported_libraries().items()
        if not {canonicalize_name(each) for each in distributions.get(root, [])} & installed
    }
    assert missing == set()
