"""`python -m harness.report RUN_DIRS… | --tracking-uri URI` (the command lives in harness.cli.report)."""
from harness.base.commands import run_command

if __name__ == "__main__":
    run_command("harness.cli.report")  # Ctrl-C or SIGTERM at any moment: one line, ended by the signal
