"""`quipu keys create|list|revoke`: the gateway's API keys, in the keys file the operator controls.

    quipu keys create --principal ana --tenant acme                # runs and memory of ana
    quipu keys create --principal ops --tenant acme --admin        # everything of tenant acme
    quipu keys list
    quipu keys revoke 1a2b3c4d5e6f

The key is printed once; the file keeps its sha256 only. The file is `QUIPU_GATEWAY_API_KEYS_FILE`,
else `~/.config/quipu/gateway-keys.json` (the one `quipu up` uses); a running gateway sees a new
or revoked key at its next request. Like every command, what it does is imported when it runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from quipu.services.gateway.access import Scope

LOCAL_ADMIN = "quipu up local admin"
"""Name of the key `quipu up` issues itself (the previous one is revoked at each start)."""

SCOPES = ("runs:read", "runs:write", "memory:read", "memory:write", "admin")
"""What `--scope` accepts (quipu.services.gateway.access.Scope)."""

keys_app = typer.Typer(
    help="Issue, list and revoke the gateway's API keys.", no_args_is_help=True, rich_markup_mode=None
)


def keys_file_path() -> Path:
    """The keys file: `QUIPU_GATEWAY_API_KEYS_FILE`, else the user's config directory."""
    configured = os.environ.get("QUIPU_GATEWAY_API_KEYS_FILE")
    if configured:
        return Path(configured)
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "quipu" / "gateway-keys.json"


def issue_local_admin(path: Path) -> str:
    """A fresh admin key of the default tenant for the embedded default; the previous one is revoked."""
    from quipu.services.gateway.access import Scope  # noqa: PLC0415 - not for --help
    from quipu.services.gateway.api_keys import KeyFile, new_key  # noqa: PLC0415

    keys = KeyFile(path)
    keys.revoke_named(LOCAL_ADMIN)
    key, stored = new_key(tenant_id="", principal_id="local-admin", scopes=[Scope.ADMIN], name=LOCAL_ADMIN)
    keys.add(stored)
    return key


def local_gateway_access() -> tuple[Path, str]:
    """The keys file `quipu up` hands its gateway, and the local admin key it just issued there."""
    path = keys_file_path()
    return path, issue_local_admin(path)


def _scopes(names: list[str] | None, admin: bool) -> list[Scope]:
    from quipu.services.gateway.access import Scope  # noqa: PLC0415

    if admin:
        return [Scope.ADMIN]
    if not names:
        return [Scope.RUNS_READ, Scope.RUNS_WRITE, Scope.MEMORY_READ, Scope.MEMORY_WRITE]
    unknown = sorted(set(names) - set(SCOPES))
    if unknown:
        raise typer.BadParameter(
            f"unknown scope {unknown[0]!r}; one of {', '.join(SCOPES)}", param_hint="--scope"
        )
    return [Scope(name) for name in names]


FileOption = Annotated[
    Path | None,
    typer.Option("--file", help="Keys file; default: QUIPU_GATEWAY_API_KEYS_FILE, else ~/.config."),
]


@keys_app.command("create")
def create(
    principal: Annotated[str, typer.Option("--principal", "-p", help="The principal the key acts as.")],
    tenant: Annotated[str, typer.Option("--tenant", "-t", help="The tenant it acts in.")] = "",
    scope: Annotated[
        list[str] | None,
        typer.Option("--scope", help=f"A scope, repeatable ({', '.join(SCOPES)}); default: runs and memory."),
    ] = None,
    admin: Annotated[bool, typer.Option("--admin", help="Every scope over the whole tenant.")] = False,
    name: Annotated[str, typer.Option("--name", help="What the key is for.")] = "",
    file: FileOption = None,
) -> None:
    """Issue a key; it is printed once and never stored."""
    from rich.text import Text  # noqa: PLC0415

    from quipu.services.cli.output import console  # noqa: PLC0415
    from quipu.services.gateway.api_keys import KeyFile, new_key  # noqa: PLC0415

    if not principal.strip():
        raise typer.BadParameter("a key acts as a principal", param_hint="--principal")
    key, stored = new_key(tenant_id=tenant, principal_id=principal, scopes=_scopes(scope, admin), name=name)
    path = file or keys_file_path()
    KeyFile(path).add(stored)
    console.print(key, soft_wrap=True)
    console.print(
        Text(
            f"key {stored.key_id} for {principal!r} in tenant {tenant!r} "
            f"({', '.join(scope.value for scope in stored.scopes)}), kept hashed in {path}; "
            "it is shown only now",
            style="dim",
        )
    )


@keys_app.command("list")
def list_keys(file: FileOption = None) -> None:
    """Every key issued (never a secret), revoked ones marked."""
    from rich.table import Table  # noqa: PLC0415

    from quipu.contracts.wire import format_timestamp  # noqa: PLC0415
    from quipu.services.cli.output import console  # noqa: PLC0415
    from quipu.services.gateway.api_keys import KeyFile  # noqa: PLC0415

    table = Table("principal", "tenant", "scopes", "name", "created", "revoked")
    table.add_column("key id", no_wrap=True)  # whole, to copy into `quipu keys revoke`
    for key in KeyFile(file or keys_file_path()).read().keys:
        table.add_row(
            key.principal_id,
            key.tenant_id,
            " ".join(scope.value for scope in key.scopes),
            key.name,
            format_timestamp(key.created_at),
            format_timestamp(key.revoked_at) if key.revoked_at else "",
            key.key_id,
        )
    console.print(table)


@keys_app.command("revoke")
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key id (`quipu keys list`).")], file: FileOption = None
) -> None:
    """Revoke a key: the gateway refuses it from its next request on."""
    from quipu.services.cli.output import console, fail  # noqa: PLC0415
    from quipu.services.gateway.api_keys import KeyFile  # noqa: PLC0415

    if KeyFile(file or keys_file_path()).revoke(key_id) is None:
        fail(f"no key {key_id!r}")
    console.print(f"key {key_id} revoked")
