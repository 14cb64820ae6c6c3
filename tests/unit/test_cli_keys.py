"""`quipu keys create|list|revoke` and the local admin key of `quipu up`, over a keys file of its own."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

from typer.testing import CliRunner

from quipu.services.cli import app
from quipu.services.cli.keys import issue_local_admin
from quipu.services.gateway.access import Scope
from quipu.services.gateway.api_keys import KeyFile, split_key, verify

runner = CliRunner()


def _create(path: Path, *arguments: str) -> str:
    result = runner.invoke(app, ["keys", "create", "--file", str(path), *arguments])
    assert result.exit_code == 0, result.output
    key = result.output.split()[0]
    assert split_key(key) is not None, result.output
    return key


def test_a_created_key_is_shown_once_and_verifies_as_its_principal(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    key = _create(path, "--principal", "ana", "--tenant", "acme", "--name", "ana's laptop")
    stored = verify(key, KeyFile(path).current())
    assert stored is not None
    caller = stored.caller()
    assert (caller.tenant_id, caller.principal_id, caller.admin) == ("acme", "ana", False)
    assert caller.scopes == {Scope.RUNS_READ, Scope.RUNS_WRITE, Scope.MEMORY_READ, Scope.MEMORY_WRITE}
    listed = runner.invoke(app, ["keys", "list", "--file", str(path)])
    assert listed.exit_code == 0 and stored.key_id in listed.output and "ana" in listed.output
    assert key not in listed.output and (split_key(key) or ("", ""))[1] not in path.read_text()


def test_scopes_and_admin_are_chosen_at_creation(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    reader = _create(path, "-p", "bot", "--scope", "runs:read")
    admin = _create(path, "-p", "ops", "-t", "acme", "--admin")
    keys = KeyFile(path).current()
    assert (verify(reader, keys) or _missing()).scopes == [Scope.RUNS_READ]
    assert (verify(admin, keys) or _missing()).caller().admin
    refused = runner.invoke(app, ["keys", "create", "--file", str(path), "-p", "x", "--scope", "root"])
    assert refused.exit_code != 0


def test_a_revoked_key_no_longer_verifies(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    key = _create(path, "-p", "ana")
    key_id = (split_key(key) or ("", ""))[0]
    revoked = runner.invoke(app, ["keys", "revoke", key_id, "--file", str(path)])
    assert revoked.exit_code == 0, revoked.output
    assert verify(key, KeyFile(path).current()) is None
    assert runner.invoke(app, ["keys", "revoke", "nope", "--file", str(path)]).exit_code == 1


def test_each_quipu_up_replaces_its_local_admin_key_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    own = _create(path, "-p", "ana")
    first = issue_local_admin(path)
    second = issue_local_admin(path)
    keys = KeyFile(path).current()
    assert verify(first, keys) is None
    assert (verify(second, keys) or _missing()).caller().admin
    assert verify(own, keys) is not None


def _missing() -> NoReturn:
    raise AssertionError("the key does not verify")
