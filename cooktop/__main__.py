"""``python -m cooktop`` runs the ``cooktop`` command."""

from .cli.main import main

main()
