"""`python -m harness.repro --out DIR` (the command lives in harness.cli.repro)."""
from harness.base.commands import run_command

if __name__ == "__main__":
    run_command("harness.cli.repro")  # Ctrl-C or SIGTERM at any moment: one line, ended by the signal
