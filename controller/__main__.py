"""``python -m controller`` is the ``agentauth`` command."""

from controller.cli import main

main()
