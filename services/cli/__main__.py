"""`python -m quipu.services.cli`: the same as the `quipu` command."""

from quipu.services.cli import main

main()
