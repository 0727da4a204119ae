"""`python -m harness.advise …` (the command lives in harness.cli.advise)."""
from harness.base.commands import run_command

if __name__ == "__main__":
    run_command("harness.cli.advise")  # Ctrl-C or SIGTERM at any moment: one line, ended by the signal
