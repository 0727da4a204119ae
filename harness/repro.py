"""`python -m harness.repro --out DIR` (the command lives in harness.cli.repro)."""
import sys

from harness.cli.repro import main

if __name__ == "__main__":
    sys.exit(main())
