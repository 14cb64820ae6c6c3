"""A stand-in service for supervisor tests: says it is ready, logs a line, then waits to be killed.

`python -m tests.support.chatty_service`; `CHATTY_EXIT_CODE` makes it exit at once with that code.
"""

from __future__ import annotations

import os
import sys
import time

if __name__ == "__main__":
    code = os.environ.get("CHATTY_EXIT_CODE")
    print(f"ready {os.getpid()}", flush=True)
    print('{"event": "a log line", "level": "warning"}', flush=True)
    if code is not None:
        sys.exit(int(code))
    while True:
        time.sleep(3600)
