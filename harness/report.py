"""`python -m harness.report RUN_DIRS… | --tracking-uri URI` (the command lives in harness.cli.report)."""
import sys

from harness.cli.report import main

if __name__ == "__main__":
    sys.exit(main())
