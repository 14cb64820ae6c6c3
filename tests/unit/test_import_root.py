"""One import root: the wheel installs `quipu` and nothing else, and no code imports the folders by
their bare names (which would load a second copy of every module beside `quipu.…`)."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("quipu", "contracts", "services", "deploy", "tests", "bench")
BARE_ROOTS = {"contracts", "services", "deploy"}


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_no_module_imports_a_folder_by_its_bare_name() -> None:
    offenders = [
        str(path.relative_to(REPOSITORY))
        for folder in SOURCE_FOLDERS[1:]
        for path in sorted((REPOSITORY / folder).rglob("*.py"))
        if _imported_roots(path) & BARE_ROOTS
    ]
    assert offenders == []


def test_the_import_root_links_the_top_level_folders() -> None:
    for name in sorted(BARE_ROOTS):
        link = REPOSITORY / "quipu" / name
        assert link.is_symlink() and link.resolve() == (REPOSITORY / name).resolve()
    assert (REPOSITORY / "quipu" / "py.typed").is_file()


@pytest.mark.slow
def test_the_wheel_installs_exactly_one_top_level_package(quipu_wheel: Path) -> None:
    names = zipfile.ZipFile(quipu_wheel).namelist()
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == {"quipu"}
    assert {"quipu/py.typed", "quipu/services/gateway/static/index.html"} <= set(names)
