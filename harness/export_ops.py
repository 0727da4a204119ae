"""`python -m harness.export_ops [overrides] --out ops.csv` (the command lives in harness.cli.export_ops)."""
import sys

from harness.cli.export_ops import main

if __name__ == "__main__":
    sys.exit(main())
