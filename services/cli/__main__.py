"""`python -m services.cli`: the same as the `quipu` command."""

from services.cli import main

main()
