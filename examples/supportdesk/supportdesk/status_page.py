"""A stand-in for the shop's status page, to try the desk on one machine.

    python -m supportdesk.status_page --port 8765 --delay 1.5

answers `GET /status/<service>` with `{"state": ..., "note": ...}` after `--delay` seconds (a
status page across an ocean). In production `SUPPORTDESK_STATUS_URL` names the real one.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self

STATES: Mapping[str, tuple[str, str]] = {
    "checkout": ("up", "orders are being taken normally"),
    "payments": ("degraded", "card payments take up to a minute to confirm"),
    "shipping": ("up", "parcels leave the warehouse the same day"),
}
"""What the stand-in says of each service: (state, note)."""


class StatusPage:
    """The status page on a loopback port, served from a background thread while the block runs."""

    def __init__(self, port: int = 0, delay_s: float = 0.0, states: Mapping[str, tuple[str, str]] = STATES):
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(states, delay_s, self._stopping))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._serve, name="status-page", daemon=True)

    @property
    def url(self) -> str:
        """Where it answers, e.g. http://127.0.0.1:8765 (for SUPPORTDESK_STATUS_URL)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def _serve(self) -> None:
        self._server.serve_forever(poll_interval=0.05)  # how soon `shutdown` is noticed

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stopping.set()  # answers still being delayed are dropped at once
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _handler(
    states: Mapping[str, tuple[str, str]], delay_s: float, stopping: threading.Event
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if stopping.wait(delay_s):
                return
            service = self.path.removeprefix("/status/")
            if service not in states:
                self.send_error(HTTPStatus.NOT_FOUND, "no such service")
                return
            state, note = states[service]
            body = json.dumps({"service": service, "state": state, "note": note}).encode()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the desk's logs are the services'."""

    return Handler


def main() -> None:
    """`python -m supportdesk.status_page`: serve until Ctrl-C (SIGINT) or SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--delay", type=float, default=1.0, help="seconds before each answer")
    options = parser.parse_args()
    stop = threading.Event()
    # Handled here, not left to Python's KeyboardInterrupt: a process started in the background of
    # a non-interactive shell (a CI job, `nohup ... &`) inherits SIGINT ignored, and Python then
    # installs no handler of its own, so Ctrl-C would never reach it.
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    with StatusPage(options.port, options.delay) as page:
        print(f"status page on {page.url} (SUPPORTDESK_STATUS_URL={page.url}); Ctrl-C stops it", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
