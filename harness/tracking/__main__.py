"""`python -m harness.tracking log RUN_DIR …` (the command lives in harness.tracking.store)."""
import sys

from harness.tracking.store import main

if __name__ == "__main__":
    sys.exit(main())
