"""`python -m quipu.deploy.local.secantus_daemon --transaction-lifetime-s N [secantus flags]`.

SecantusDB's daemon command line has no flag for the transaction lifetime (mongod's
`transactionLifetimeLimitSeconds`, 60 s in both). A transaction whose client was killed stays
open, and holds its documents, until that lifetime runs out: a storage owner restarted after a
SIGKILL would wait for it. This launcher runs the daemon unchanged but for that one value.
"""

from __future__ import annotations

import argparse
import functools
import sys

from secantus import cli, server


def main() -> int:
    """Parse our flag, hand every other flag to SecantusDB's own command line."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--transaction-lifetime-s", type=float, default=60.0)
    ours, theirs = parser.parse_known_args()
    cli.SecantusDBServer = functools.partial(  # type: ignore[misc,unused-ignore]
        server.SecantusDBServer, transaction_lifetime_seconds=ours.transaction_lifetime_s
    )
    status: int = cli.main(theirs)
    return status


if __name__ == "__main__":
    sys.exit(main())
