"""`python -m harness.tracking log RUN_DIR …` (the command lives in harness.tracking.store)."""
from harness.base.commands import run_command

if __name__ == "__main__":
    run_command("harness.tracking.store")  # Ctrl-C or SIGTERM at any moment: one line, ended by the signal
