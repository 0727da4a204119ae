"""`python -m harness.profile TRACE --out DIR` (the command lives in harness.cli.profile)."""
import sys

from harness.cli.profile import main

if __name__ == "__main__":
    sys.exit(main())
