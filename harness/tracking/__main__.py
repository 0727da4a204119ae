"""`python -m harness.tracking log RUN_DIR …` (the command lives in harness.tracking.log_command)."""
from harness.base.commands import run_command

if __name__ == "__main__":
    run_command("harness.tracking.log_command")  # Ctrl-C or SIGTERM at any moment: one line, ended by the signal
