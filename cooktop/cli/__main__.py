"""``python -m cooktop.cli`` runs the ``cooktop`` command."""

from .main import main

main()
