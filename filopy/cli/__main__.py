"""`python -m filopy.cli`: the CLI, as the `filopy` script runs it."""

from filopy.cli.main import app

if __name__ == "__main__":
    app()
