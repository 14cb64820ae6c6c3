"""A stand-in service for supervisor tests: says it is ready, logs a line, then waits to be killed.

`python -m tests.support.chatty_service`; `CHATTY_EXIT_CODE` makes it exit at once with that code,
`CHATTY_STOP_S` makes it take that long to exit after SIGTERM (a service draining its work).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType

if __name__ == "__main__":
    code = os.environ.get("CHATTY_EXIT_CODE")
    if "CHATTY_STOP_S" in os.environ:
        stop_s = float(os.environ["CHATTY_STOP_S"])

        def drain_then_exit(_signum: int, _frame: FrameType | None) -> None:
            time.sleep(stop_s)
            sys.exit(0)

        signal.signal(signal.SIGTERM, drain_then_exit)
    print(f"ready {os.getpid()}", flush=True)
    print('{"event": "a log line", "level": "warning"}', flush=True)
    if code is not None:
        sys.exit(int(code))
    while True:
        time.sleep(3600)
