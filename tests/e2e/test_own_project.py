"""A user's own code, installed and run as its user runs it: a fresh venv, `quipu up --app`, `quipu run`.

One virtualenv for the module, made as a user makes one: the wheel of this Quipu built and
installed into it by pip (dependencies from pip's cache; no bytecode compiled ahead, the only
shortcut, which Python does on first import anyway). Then, with only that venv's commands and no
model key, the example project `examples/supportdesk` is pip-installed with its test extra and its
own tests pass with its own pytest.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from quipu.services.cli.state import STATE_FILE_ENV
from tests.timing import scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(600))]

REPOSITORY = Path(__file__).resolve().parents[2]
EXAMPLE = REPOSITORY / "examples" / "supportdesk"


@dataclass(frozen=True)
class Virtualenv:
    """A fresh virtualenv with this Quipu installed from its wheel."""

    root: Path

    def command(self, name: str) -> str:
        return str(self.root / "bin" / name)

    def install(self, *requirements: str) -> None:
        """`pip install` into this venv (pip of the test's interpreter, `--python` pointed here)."""
        pip("--python", self.command("python"), "install", "--no-compile", *requirements)


def pip(*arguments: str, cwd: Path = REPOSITORY) -> None:
    """Run pip quietly; fail with what it said."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", *arguments, "--quiet"],
        cwd=cwd, capture_output=True, text=True, timeout=scaled(300), check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Virtualenv:
    wheels = tmp_path_factory.mktemp("wheels")
    pip("wheel", "--no-deps", "--wheel-dir", str(wheels), ".")
    (wheel,) = wheels.glob("quipu-*.whl")
    made = Virtualenv(tmp_path_factory.mktemp("venv"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(made.root)], check=True)
    made.install(str(wheel))
    return made


def user_environment(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a user's shell: no stack of the test's, no model key, state files in `home`."""
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("QUIPU_", "VIRTUAL_ENV", "PYTHON"))
    }
    environment[STATE_FILE_ENV] = str(home / "up.json")
    environment["QUIPU_GATEWAY_API_KEYS_FILE"] = str(home / "gateway-keys.json")
    return environment | extra


@pytest.fixture(scope="module")
def desk_installed(venv: Virtualenv) -> Virtualenv:
    venv.install(f"{EXAMPLE}[test]")
    return venv


def test_the_example_projects_own_tests_pass_where_it_is_installed(
    desk_installed: Virtualenv, tmp_path: Path
) -> None:
    ran = subprocess.run(
        [desk_installed.command("python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=EXAMPLE, env=user_environment(tmp_path), capture_output=True, text=True,
        timeout=scaled(120), check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"\b\d+ passed\b", ran.stdout)
