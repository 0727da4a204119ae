"""`python -m harness.profile TRACE --out DIR` (the command lives in harness.cli.profile)."""
from harness.base.commands import run_command

if __name__ == "__main__":
    run_command("harness.cli.profile")  # Ctrl-C or SIGTERM at any moment: one line, ended by the signal
