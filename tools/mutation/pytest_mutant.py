"""Run pytest on one mutant, in the copy of the tree the mutant was written into (the current folder).

Cosmic Ray calls this as each mutant's test command (tools/mutation/run.py sets it). It makes each run
independent of the ones before:

* Numba keys its cache by the source file's content: a mutant of a file with kernels compiles them
  again and overwrites the index, so every mutant starts from its own copy of the cache the unmutated
  tree built (HOSTBOUND_MUTATION_NUMBA_CACHE) and only the mutated file's kernels compile.
* Python's .pyc check is by modification time and size, which a one-character mutant written within
  the same second can share with the original: nothing is written and the project has no .pyc to go stale.
* Hypothesis runs derandomized and without its example database, so a mutant's verdict does not depend
  on what failed for the mutants before it.
* Subprocesses the tests start (`python -m harness …`) import the mutated copy (PYTHONPATH).
* pytest runs in one process with only these options (the project's addopts spread it over
  workers, where coverage records no test contexts).
* Kernels run with Numba's bounds checks (NUMBA_BOUNDSCHECK, also in the unmutated run that built the
  cache): a mutant that indexes past an array fails loudly instead of reading whatever lies there.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile


def main(test_args: list[str]) -> int:
    tree = os.getcwd()
    shutil.rmtree(os.path.join(tree, ".hypothesis"), ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="hostbound-mutant-") as scratch:
        cache = os.path.join(scratch, "numba")
        shutil.copytree(os.environ["HOSTBOUND_MUTATION_NUMBA_CACHE"], cache)
        env = {
            **os.environ,
            "NUMBA_CACHE_DIR": cache,
            "PYTHONPATH": tree,
            "PYTHONDONTWRITEBYTECODE": "1",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "NUMBA_BOUNDSCHECK": "1",
        }
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-o", "addopts=", "-p", "no:xdist", "-p", "no:cacheprovider", "-p", "no:cov", "-p", "no:anyio", "--hypothesis-seed=0", *test_args]
        return subprocess.call(command, env=env, cwd=tree)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
