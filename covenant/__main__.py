"""``python -m covenant`` runs the CLI."""

from covenant.cli.main import main

main()
