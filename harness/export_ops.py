"""`python -m harness.export_ops [overrides] --out ops.csv` (the command lives in harness.cli.export_ops)."""
from harness.base.commands import run_command

if __name__ == "__main__":
    run_command("harness.cli.export_ops")  # Ctrl-C or SIGTERM at any moment: one line, ended by the signal
