"""``python -m controller`` is the ``agentauth`` command."""

from controller.cli import main

if __name__ == "__main__":  # not when a worker process re-imports this module (spawn)
    main()
