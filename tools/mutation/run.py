"""Mutation testing of the core modules with Cosmic Ray: plant small bugs, one at a time, and check that
the unit-level tests covering the module fail on each (docs/testing.md: how to run it, the last score,
the survivors and why the equivalent ones are).

    pip install -e '.[test]'
    python tools/mutation/run.py                          # every target; resumes where it stopped
    python tools/mutation/run.py --target engine --target policies
    python tools/mutation/run.py --retest                 # the survivors again, first (after adding tests)
    python tools/mutation/run.py --minutes 60             # an hour's random sample of the mutants left
    python tools/mutation/run.py --report docs/testing.md # rewrite the results section of the doc
    python tools/mutation/run.py --survivors              # survivors, as entries of equivalent.toml

What it does:

* Targets and their tests: tools/mutation/targets.toml. A mutant runs only the tests of its target that
  cover its line (coverage.py, one context per test, from the unmutated run); a line no test reaches
  survives without running anything. Numba kernels are not traced, and module-level code runs at
  import: their mutants run all of the target's tests.
* Mutants: Cosmic Ray's operators, restricted to the small, realistic bugs of `OPERATORS` (an operator
  swapped for its neighbour, a comparison moved by one, a number off by one, a condition negated,
  a loop that never runs). Not made: mutants inside message text (f-strings, log calls; what a message
  says is pinned by the tests of bad input), in type annotations (never evaluated), and a number of a
  million or more off by one (results move by a millionth: no user could see it).
* Sessions: one Cosmic Ray session per module under outputs/mutation/sessions/, made again when the
  module's text changed (its mutants are then other mutants); results are kept otherwise, so an
  interrupted run resumes and `--retest` runs only the survivors.
* Isolation: every worker runs in its own copy of the working tree (outputs/mutation/tree-N, made
  afresh each time, so new tests count) with its own Numba cache built by the unmutated tests
  (which must pass first); tools/mutation/pytest_mutant.py runs each mutant's tests from a copy of it.
* Equivalent mutants (no test can tell them apart from the original): tools/mutation/equivalent.toml,
  each with the reason. The score is killed / (mutants - equivalent).
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import multiprocessing
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import toml
from cosmic_ray.commands.init import init as cosmic_ray_init
from cosmic_ray.mutating import mutate_and_test
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult

TOOL = Path(__file__).resolve().parent
REPO = TOOL.parent.parent
STATE = REPO / "outputs" / "mutation"
TARGETS_FILE = TOOL / "targets.toml"
EQUIVALENT_FILE = TOOL / "equivalent.toml"

# The mutants made: each operator replaced by its nearest neighbour only (a + b → a - b, a < b → a <= b,
# …), not by every other operator: the bugs that pass review are of that size, and a mutant that no
# test could miss (a + b → a ** b) only costs time.
OPERATORS = re.compile(
    r"core/("
    r"ReplaceBinaryOperator_(Add_Sub|Sub_Add|Mul_Div|Div_Mul|FloorDiv_Div|Mod_FloorDiv|Pow_Mul"
    r"|BitAnd_BitOr|BitOr_BitAnd|BitXor_BitOr|LShift_RShift|RShift_LShift)"
    r"|ReplaceComparisonOperator_(Eq_NotEq|NotEq_Eq|Lt_LtE|LtE_Lt|Gt_GtE|GtE_Gt|Is_IsNot|IsNot_Is)"
    r"|ReplaceUnaryOperator_(USub_UAdd|Delete_Not|Delete_Invert)"
    r"|ReplaceTrueWithFalse|ReplaceFalseWithTrue|ReplaceAndWithOr|ReplaceOrWithAnd"
    r"|ReplaceBreakWithContinue|ReplaceContinueWithBreak|NumberReplacer|ZeroIterationForLoop"
    r")$"
)
SKIP_OPERATOR = "operator not in the set"
SKIP_MESSAGE = "message text"
SKIP_ANNOTATION = "type annotation"
# A number of a million or more off by one moves results by a millionth or less: no user could see it.
SKIP_LARGE_NUMBER = "off by one of a number of a million or more"
LARGE_NUMBER = 1e6
FILTERS_VERSION = "3"  # change when the mutants made change: sessions are made again
# A mutant's tests may take this many times their unmutated time (plus start-up and compiling the
# mutated kernels) before it counts as killed by a timeout (an endless loop).
TIMEOUT_FACTOR = 4.0
TIMEOUT_EXTRA_S = 30.0


@dataclass
class Target:
    name: str
    modules: list[str]
    tests: list[str]
    reach_all: bool = False  # every mutant runs every test (they reach the module in subprocesses)
    baseline_s: float = 0.0
    test_s: dict[str, float] = field(default_factory=dict)  # unmutated seconds of each test (file::function)

    def timeout_s(self, tests: list[str] | None) -> float:
        """How long the mutant's tests may run: a few times what they took unmutated."""
        took = self.baseline_s if tests is None else sum(self.test_s.get(t, self.baseline_s) for t in tests)
        return TIMEOUT_FACTOR * min(took, self.baseline_s) + TIMEOUT_EXTRA_S

    def command(self, tests: list[str] | None) -> str:
        """The command that runs `tests` (None: all of the target's) against a mutant."""
        return " ".join([sys.executable, "tools/mutation/pytest_mutant.py", *(self.tests if tests is None else tests)])


def load_targets(names: list[str], path: Path = TARGETS_FILE) -> list[Target]:
    targets = [Target(t["name"], list(t["modules"]), list(t["tests"]), t.get("reach") == "all") for t in toml.load(path)["target"]]
    unknown = sorted(set(names) - {t.name for t in targets})
    if unknown:
        raise SystemExit(f"mutation: error: no target {', '.join(unknown)} (targets: {', '.join(t.name for t in targets)})")
    return [t for t in targets if not names or t.name in names]


# ---------------------------------------------------------------- sessions


def session_file(module: str) -> Path:
    return STATE / "sessions" / (module.replace("/", "__") + ".sqlite")


def module_digest(module: str) -> str:
    return hashlib.sha256((REPO / module).read_bytes() + OPERATORS.pattern.encode() + FILTERS_VERSION.encode()).hexdigest()


def unmutated_spans(module: str) -> dict[str, list[tuple[tuple[int, int], tuple[int, int]]]]:
    """Where a module's text is not code that runs: message text (f-strings, the arguments of log and
    warning calls) and type annotations (strings under `from __future__ import annotations`)."""
    spans: dict[str, list] = {SKIP_MESSAGE: [], SKIP_ANNOTATION: []}

    def add(kind: str, node: ast.AST | None) -> None:
        if node is not None:
            spans[kind].append(((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)))

    for node in ast.walk(ast.parse((REPO / module).read_text())):
        if isinstance(node, ast.JoinedStr) or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in ("log", "logging", "warnings")
        ):
            add(SKIP_MESSAGE, node)
        elif isinstance(node, ast.arg):
            add(SKIP_ANNOTATION, node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            add(SKIP_ANNOTATION, node.returns)
        elif isinstance(node, ast.AnnAssign):
            add(SKIP_ANNOTATION, node.annotation)
    return spans


def number_at(lines: list[str], mutation) -> float:
    """The numeric literal a NumberReplacer mutation changes."""
    (row, col), (end_row, end_col) = mutation.start_pos, mutation.end_pos
    text = lines[row - 1][col:end_col] if row == end_row else lines[row - 1][col:]
    try:
        return float(ast.literal_eval(text.strip()))
    except (ValueError, SyntaxError):
        return 0.0


def ensure_session(module: str) -> None:
    """A session holding the module's mutants, made again when the module's text changed."""
    path = session_file(module)
    stamp = path.with_suffix(".json")
    digest = module_digest(module)
    if path.exists() and stamp.exists() and json.loads(stamp.read_text()).get("digest") == digest:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    first_file(module).unlink(missing_ok=True)  # the job ids of another text
    spans = unmutated_spans(module)
    lines = (REPO / module).read_text().splitlines()
    cwd = os.getcwd()
    os.chdir(REPO)  # mutation specs hold paths relative to the tree, the same in every copy of it
    try:
        with use_db(str(path), WorkDB.Mode.create) as db:
            cosmic_ray_init([Path(module)], db, {})
            for item in db.pending_work_items:
                mutation = item.mutations[0]
                reason = None if OPERATORS.match(mutation.operator_name) else SKIP_OPERATOR
                for kind, where in spans.items():
                    if reason is None and any(start <= tuple(mutation.start_pos) < end for start, end in where):
                        reason = kind
                if reason is None and mutation.operator_name == "core/NumberReplacer" and abs(number_at(lines, mutation)) >= LARGE_NUMBER:
                    reason = SKIP_LARGE_NUMBER
                if reason:
                    db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=reason))
    finally:
        os.chdir(cwd)
    stamp.write_text(json.dumps({"module": module, "digest": digest}))


def first_file(module: str) -> Path:
    """The job ids of a module's survivors forgotten to run again: they stay first until they have run,
    even when a run stops before reaching them."""
    return STATE / "sessions" / (module.replace("/", "__") + ".first.json")


def forget_survivors(module: str, equivalent: "Equivalents | None" = None) -> set[str]:
    """Drop the results of the survivors not judged equivalent, so that they run again; the job ids of
    every survivor waiting to run again (these and those forgotten before that have not run yet)."""
    equivalent = equivalent or Equivalents()
    with use_db(str(session_file(module)), WorkDB.Mode.open) as db:
        survivors = [(item, result) for item, result in db.completed_work_items if result.test_outcome == TestOutcome.SURVIVED]
    jobs = {
        item.job_id for item, result in survivors
        if not equivalent.why(module, item.mutations[0].definition_name or "<module>", *changed_lines(result.diff or ""))
    }
    with sqlite3.connect(session_file(module)) as connection:
        connection.executemany("delete from work_results where job_id = ?", [(job,) for job in jobs])
        done = {row[0] for row in connection.execute("select job_id from work_results")}
    path = first_file(module)
    earlier = set(json.loads(path.read_text())) if path.exists() else set()
    jobs |= earlier - done
    path.write_text(json.dumps(sorted(jobs)))
    return jobs


# ---------------------------------------------------------------- trees and baselines


def copy_tree(destination: Path) -> None:
    """The working tree as git sees it (tracked and new files, not ignored ones), without .git."""
    if destination.exists():
        shutil.rmtree(destination)
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def tree(k: int) -> Path:
    return STATE / f"tree-{k}"


def numba_cache(k: int) -> Path:
    return STATE / f"numba-{k}"


def coverage_file(target: Target) -> Path:
    return STATE / f"coverage-{target.name}"


def baseline(k: int, targets: list[Target]) -> dict[str, float]:
    """Run each target's tests unmutated in tree k, building its Numba cache; seconds per target. Tree 0
    records which test reaches which line (coverage.py, a context per test)."""
    cache = numba_cache(k)
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(tree(k)), "PYTHONDONTWRITEBYTECODE": "1",
           "MLFLOW_DISABLE_TELEMETRY": "true", "NUMBA_BOUNDSCHECK": "1"}
    seconds = {}
    for target in targets:
        traced = []
        if k == 0:
            coverage_file(target).unlink(missing_ok=True)
            env["COVERAGE_FILE"] = str(coverage_file(target))
            traced = ["--cov=harness", "--cov-context=test", "--cov-report="]
        junit = STATE / f"junit-{target.name}-{k}.xml"
        began = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-o", "addopts=", "-p", "no:xdist", "-p", "no:cacheprovider", "--hypothesis-seed=0", f"--junitxml={junit}", *traced,
             *target.tests],
            cwd=tree(k), env=env, capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(f"mutation: error: the unmutated tests of {target.name} fail; fix them first:\n{proc.stdout[-3000:]}")
        seconds[target.name] = time.perf_counter() - began
    return seconds


def test_seconds(target: Target, workers: int) -> dict[str, float]:
    """Seconds each test (file::function, its parameters summed) took unmutated, the slower tree's."""
    import xml.etree.ElementTree as ElementTree

    took: dict[str, float] = {}
    for k in range(workers):
        mine: dict[str, float] = {}
        for case in ElementTree.parse(STATE / f"junit-{target.name}-{k}.xml").iter("testcase"):
            path = case.get("classname", "").replace(".", "/") + ".py"
            name = re.sub(r"\[.*$", "", case.get("name", ""))
            mine[f"{path}::{name}"] = mine.get(f"{path}::{name}", 0.0) + float(case.get("time", 0.0))
        for test, seconds in mine.items():
            took[test] = max(took.get(test, 0.0), seconds)
    return took


# ---------------------------------------------------------------- which tests reach a mutant


class Coverage:
    """Which of a target's tests reach each line of its modules (from the unmutated run in tree 0).

    Numba kernels are not traced: the tests that reach a kernel are those that reach the Python lines
    calling it (through other kernels if need be)."""

    def __init__(self, target: Target):
        from coverage import CoverageData

        self.target = target
        self.data = CoverageData(basename=str(coverage_file(target)))
        self.data.read()
        if not target.reach_all and len(self.data.measured_contexts()) < 2:
            raise SystemExit(f"mutation: error: {coverage_file(target)} holds no test contexts: coverage did not record which test ran what")
        self.parsed: dict[str, tuple[ast.Module, dict[str, tuple[int, int]]]] = {}

    def _module(self, module: str) -> tuple[ast.Module, dict[str, tuple[int, int]]]:
        if module not in self.parsed:
            tree_ = ast.parse((REPO / module).read_text())
            kernels = {
                node.name: (node.lineno, node.end_lineno)
                for node in ast.walk(tree_)
                if isinstance(node, ast.FunctionDef) and any("njit" in ast.unparse(d) for d in node.decorator_list)
            }
            self.parsed[module] = (tree_, kernels)
        return self.parsed[module]

    @staticmethod
    def _statement_lines(parsed: ast.Module, line: int) -> tuple[range, bool] | None:
        """The lines of the innermost statement at `line` (a compound statement's header only), and
        whether it runs inside a function (else at import); None when no statement holds the line."""
        statement, in_function = None, False
        for node in ast.walk(parsed):
            if isinstance(node, ast.stmt) and node.lineno <= line <= node.end_lineno:
                if statement is None or (node.lineno >= statement.lineno and node.end_lineno <= statement.end_lineno):
                    statement = node
            # Inside a function's body, not its signature: a default on a continuation line of a multi-line
            # `def` runs with the `def`, at import (it was taken for a body line no test reaches: never run).
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body[0].lineno <= line <= node.end_lineno:
                in_function = True
            if isinstance(node, ast.Lambda) and node.body.lineno <= line <= node.end_lineno:
                in_function = True
        if statement is None:
            return None
        body = getattr(statement, "body", None)
        last = body[0].lineno - 1 if isinstance(body, list) and body and body[0].lineno > statement.lineno else statement.end_lineno
        return range(statement.lineno, max(last, statement.lineno) + 1), in_function

    @staticmethod
    def _jump_holder_lines(parsed: ast.Module, line: int) -> range:
        """The header lines of the statement whose body holds a `continue` or `break` at `line`
        (empty when the line holds no such jump)."""
        for node in ast.walk(parsed):
            if not isinstance(node, ast.stmt):
                continue
            for field_ in ("body", "orelse"):
                for child in getattr(node, field_, None) or []:
                    if isinstance(child, (ast.Continue, ast.Break)) and child.lineno == line:
                        first_body = node.body[0].lineno if node.body else node.end_lineno + 1
                        return range(node.lineno, max(first_body, node.lineno + 1))
        return range(0)

    def _call_sites(self, module: str, kernel: str, seen: set[str]) -> list[int] | None:
        """Python lines that call `kernel`, directly or through other kernels; None if there are none."""
        parsed, kernels = self._module(module)
        seen.add(kernel)
        lines: list[int] = []
        for node in ast.walk(parsed):
            if not (isinstance(node, ast.Name) and node.id == kernel or isinstance(node, ast.Attribute) and node.attr == kernel):
                continue
            caller = next((name for name, (first, last) in kernels.items() if first <= node.lineno <= last), None)
            if caller == kernel or caller in seen:
                continue
            if caller is not None:
                deeper = self._call_sites(module, caller, seen)
                if deeper is None:
                    return None
                lines += deeper
            else:
                lines.append(node.lineno)
        return lines or None

    def tests_for(self, module: str, line: int) -> list[str] | None:
        """The tests (file::function) reaching the statement at `line`, in targets.toml's file order;
        None: every test of the target (code that runs at import, or a target run whole)."""
        if self.target.reach_all:
            return None
        parsed, kernels = self._module(module)
        kernel = next((name for name, (first, last) in kernels.items() if first <= line <= last), None)
        if kernel is not None:
            sites = self._call_sites(module, kernel, set())
            if sites is None:
                return None
            lines = [n for site in sites for n in (self._statement_lines(parsed, site) or (range(site, site + 1), True))[0]]
        else:
            found = self._statement_lines(parsed, line)
            if found is None or not found[1]:
                return None  # module level, a def or class line: runs at import, outside any test
            lines = list(found[0])
        contexts: set[str] = set()
        by_line = self.data.contexts_by_lineno(str(tree(0) / module))
        for number in lines:
            contexts.update(by_line.get(number, ()))
        if not contexts and kernel is None:
            # CPython folds `if …: continue` (and break) into the condition's jump, so the jump's own
            # line never reports: take the tests that reach the statement holding it.
            for number in self._jump_holder_lines(parsed, line):
                contexts.update(by_line.get(number, ()))
        tests: set[str] = set()
        for context in filter(None, contexts):
            name, _, phase = context.partition("|")
            test = re.sub(r"\[.*$", "", name)
            path = test.split("::")[0]
            # A line run while a test was set up may belong to a fixture that other tests of the file
            # share (scope="module"): coverage credits only the first of them. Run the whole file.
            tests.add(path if phase == "setup" and path in self.target.tests else test)
        if kernel is not None:
            # Tests may call a kernel themselves (coverage sees no call site then): their whole files.
            calls_it = re.compile(rf"\b{kernel}\b")
            tests |= {p for p in self.target.tests if "::" not in p and (REPO / p).is_file() and calls_it.search((REPO / p).read_text())}
        tests = {t for t in tests if "::" not in t or t.split("::")[0] not in tests}
        order = {path: i for i, path in enumerate(self.target.tests)}
        return sorted(tests, key=lambda t: (order.get(t.split("::")[0], len(order)), t))


UNCOVERED = "no test reaches this line"


def mutant_diff(mutation) -> str:
    """The diff a mutation makes, without running anything (for mutants no test reaches)."""
    import difflib

    from cosmic_ray.mutating import mutate_code
    from cosmic_ray.plugins import get_operator

    code = (REPO / mutation.module_path).read_text()
    mutated = mutate_code(code, get_operator(mutation.operator_name)(**(mutation.operator_args or {})), mutation.occurrence)
    if mutated is None:
        return ""
    return "".join(difflib.unified_diff(code.splitlines(True), mutated.splitlines(True), str(mutation.module_path), str(mutation.module_path)))


# ---------------------------------------------------------------- running mutants


def _enter_tree(slots) -> None:
    k = slots.get()
    os.chdir(tree(k))
    os.environ["HOSTBOUND_MUTATION_NUMBA_CACHE"] = str(numba_cache(k))


def _test_mutant(mutations, command: str, timeout_s: float) -> WorkResult:
    return mutate_and_test(mutations, command, timeout_s)


def run_mutants(targets: list[Target], workers: int, minutes: float | None = None, first: set[str] = frozenset()) -> None:
    """Run the pending mutants of the targets, in a shuffled order (fixed seed): a run stopped early,
    by `minutes` or by hand, leaves results that are a random sample of every target's mutants, not the
    first functions of the first module. The jobs in `first` (survivors run again) go before the rest."""
    jobs = []
    for target in targets:
        reach = Coverage(target)
        for module in target.modules:
            with use_db(str(session_file(module)), WorkDB.Mode.open) as db:
                for item in db.pending_work_items:
                    tests = reach.tests_for(module, item.mutations[0].start_pos[0])
                    if tests == []:
                        db.set_result(item.job_id, WorkResult(
                            worker_outcome=WorkerOutcome.NORMAL, test_outcome=TestOutcome.SURVIVED, output=UNCOVERED,
                            diff=mutant_diff(item.mutations[0]),
                        ))
                        continue
                    jobs.append((target, module, item, target.command(tests), tests))
    if not jobs:
        print("mutation: nothing left to run", file=sys.stderr)
        return
    random.Random(0).shuffle(jobs)
    jobs.sort(key=lambda job: job[2].job_id not in first)
    deadline = time.perf_counter() + minutes * 60 if minutes else None
    context = multiprocessing.get_context("fork")
    slots = context.Queue()
    for k in range(workers):
        slots.put(k)
    began = time.perf_counter()
    databases = {}
    try:
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_enter_tree, initargs=(slots,)) as pool:
            futures = {
                pool.submit(_test_mutant, item.mutations, command, target.timeout_s(tests)): (module, item) for target, module, item, command, tests in jobs
            }
            for done, future in enumerate(as_completed(futures), 1):
                if future.cancelled():
                    continue
                module, item = futures[future]
                if module not in databases:
                    databases[module] = WorkDB(str(session_file(module)), WorkDB.Mode.open)
                result = future.result()
                databases[module].set_result(item.job_id, result)
                elapsed = time.perf_counter() - began
                print(
                    f"[{done}/{len(jobs)} {elapsed / 60:.0f} min, ~{elapsed / done * (len(jobs) - done) / 60:.0f} min left] "
                    f"{module} {item.mutations[0].operator_name.removeprefix('core/')} #{item.mutations[0].occurrence}: "
                    f"{result.test_outcome.value if result.test_outcome else result.worker_outcome.value}",
                    file=sys.stderr, flush=True,
                )
                if deadline is not None and time.perf_counter() > deadline:
                    cancelled = sum(f.cancel() for f in futures)
                    print(f"mutation: {minutes:g} minutes are up; {cancelled} mutants left for the next run", file=sys.stderr, flush=True)
                    deadline = None
    finally:
        for database in databases.values():
            database.close()


# ---------------------------------------------------------------- results


@dataclass
class Mutant:
    module: str
    function: str
    line: int
    operator: str
    before: str
    after: str
    outcome: str  # killed, timeout, survived, equivalent, incompetent
    killed_by: str = ""
    why: str = ""


@dataclass
class Tally:
    mutants: list[Mutant] = field(default_factory=list)
    not_run: int = 0  # mutants of the session not run yet (an interrupted or partial run)

    def count(self, outcome: str) -> int:
        return sum(m.outcome == outcome for m in self.mutants)

    @property
    def score(self) -> float:
        counted = len(self.mutants) - self.count("equivalent") - self.count("incompetent")
        return (self.count("killed") + self.count("timeout")) / counted if counted else 1.0


def changed_lines(diff: str) -> tuple[str, str]:
    """(before, after) of a one-mutant diff: the removed and the added lines, stripped."""
    removed = [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return " ".join(removed), " ".join(added)


def killing_test(output: str) -> str:
    match = re.search(r"^(?:FAILED|ERROR) (tests/[^\s:]+(?:::[^\s]+)?)", output or "", re.MULTILINE)
    return match[1].split(" - ")[0] if match else ""


class Equivalents:
    """equivalent.toml: single mutants (module, function, the line before and after), and rules of one
    textual replacement in a module (`[[rule]]`: every mutant that replaces one `replace[0]` by
    `replace[1]`, e.g. `.shape[0]` by `.shape[-1]` where every array indexed so is one-dimensional)."""

    def __init__(self, path: Path = EQUIVALENT_FILE):
        data = toml.load(path) if path.exists() else {}
        self.single = {(m["module"], m["function"], m["before"], m["after"]): m["why"] for m in data.get("mutant", [])}
        self.rules = data.get("rule", [])

    def why(self, module: str, function: str, before: str, after: str) -> str | None:
        if (module, function, before, after) in self.single:
            return self.single[(module, function, before, after)]
        for rule in self.rules:
            old, new = rule["replace"]
            if module in rule["modules"] and any(
                before[:k] + new + before[k + len(old):] == after for k in range(len(before)) if before.startswith(old, k)
            ):
                return rule["why"]
        return None


def collect(targets: list[Target]) -> dict[str, Tally]:
    equivalent = Equivalents()
    tallies: dict[str, Tally] = {}
    for target in targets:
        tally = tallies.setdefault(target.name, Tally())
        for module in target.modules:
            path = session_file(module)
            if not path.exists():
                continue
            with use_db(str(path), WorkDB.Mode.open) as db:
                completed = db.completed_work_items
                tally.not_run += db.num_work_items - db.num_results
            for item, result in completed:
                if result.worker_outcome == WorkerOutcome.SKIPPED:
                    continue
                mutation = item.mutations[0]
                before, after = changed_lines(result.diff or "")
                function = mutation.definition_name or "<module>"
                if result.worker_outcome == WorkerOutcome.NO_TEST:
                    continue  # the operator found nothing to change at that occurrence
                if result.test_outcome == TestOutcome.SURVIVED:
                    why = equivalent.why(module, function, before, after)
                    outcome = "equivalent" if why else "uncovered" if result.output == UNCOVERED else "survived"
                elif result.test_outcome == TestOutcome.KILLED:
                    outcome = "timeout" if result.output == "timeout" else "killed"
                    why = ""
                else:
                    outcome, why = "incompetent", (result.output or "")[-300:]
                tally.mutants.append(Mutant(
                    module, function, mutation.start_pos[0], mutation.operator_name.removeprefix("core/"), before, after, outcome,
                    killing_test(result.output) if outcome == "killed" else "", why or "",
                ))
    return tallies


def report(tallies: dict[str, Tally]) -> str:
    """The results as Markdown: the score per target, then every survivor (equivalent ones with why)."""
    lines = [
        "| target | mutants | killed | timeouts | survived | no test reaches | equivalent | score | not run yet |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    total = Tally()

    def row(name: str, tally: Tally) -> str:
        counts = " | ".join(str(tally.count(k)) for k in ("killed", "timeout", "survived", "uncovered", "equivalent"))
        return f"| {name} | {len(tally.mutants)} | {counts} | {tally.score:.1%} | {tally.not_run} |"

    for name, tally in tallies.items():
        total.mutants += tally.mutants
        total.not_run += tally.not_run
        lines.append(row(name, tally))
    lines.append(row("**all**", total))
    survivors = [m for m in total.mutants if m.outcome in ("survived", "uncovered")]
    lines += ["", f"Survivors not judged equivalent ({len(survivors)}):", ""]
    lines += [
        f"- `{m.module}:{m.line}` `{m.function}`: `{m.before}` → `{m.after}`" + (" (no test reaches it)" if m.outcome == "uncovered" else "")
        for m in survivors
    ] or ["- none"]
    equivalents = [m for m in total.mutants if m.outcome == "equivalent"]
    lines += ["", f"Equivalent mutants ({len(equivalents)}), and why no test can tell them from the original:", ""]
    lines += [f"- `{m.module}:{m.line}` `{m.function}`: `{m.before}` → `{m.after}` — {m.why}" for m in equivalents] or ["- none"]
    incompetent = [m for m in total.mutants if m.outcome == "incompetent"]
    if incompetent:
        lines += ["", f"Mutants the tool could not run ({len(incompetent)}): " + ", ".join(f"`{m.module}:{m.line}`" for m in incompetent)]
    return "\n".join(lines)


BEGIN, END = "<!-- mutation results: begin (tools/mutation/run.py --report) -->", "<!-- mutation results: end -->"


def write_report(doc: Path, text: str) -> None:
    content = doc.read_text()
    if BEGIN not in content or END not in content:
        raise SystemExit(f"mutation: error: {doc} has no results section ({BEGIN} … {END})")
    head, rest = content.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def survivors_toml(tallies: dict[str, Tally]) -> str:
    """The survivors as equivalent.toml entries, their reasons left to write (or a test to add)."""
    entries = []
    for tally in tallies.values():
        for m in tally.mutants:
            if m.outcome in ("survived", "uncovered"):
                entries.append(
                    f"[[mutant]]\nmodule = {json.dumps(m.module)}\nfunction = {json.dumps(m.function)}\n"
                    f"before = {toml_literal(m.before)}\nafter = {toml_literal(m.after)}\nwhy = \"\"\n"
                )
    return "\n".join(entries)


def toml_literal(text: str) -> str:
    return f"'{text}'" if "'" not in text and "\n" not in text else json.dumps(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/mutation/run.py", description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", default=[], help="a target of targets.toml (default: all)")
    parser.add_argument("--targets-file", type=Path, default=TARGETS_FILE, help="targets and their tests (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--minutes", type=float, help="stop starting mutants after this long (the rest wait for the next run)")
    parser.add_argument("--retest", action="store_true", help="run the survivors again, before the mutants not run yet")
    parser.add_argument("--report", type=Path, metavar="DOC", help="only write the results section of DOC (docs/testing.md)")
    parser.add_argument("--survivors", action="store_true", help="only print the survivors as equivalent.toml entries")
    args = parser.parse_args(argv)
    targets = load_targets(args.target, args.targets_file)
    if args.survivors:
        print(survivors_toml(collect(targets)))
        return 0
    if args.report is None:
        again: set[str] = set()
        equivalent = Equivalents()
        for target in targets:
            for module in target.modules:
                ensure_session(module)
                if args.retest:
                    forgotten = forget_survivors(module, equivalent)
                    again |= forgotten
                    print(f"mutation: {module}: {len(forgotten)} survivors to run again (first)", file=sys.stderr)
        workers = max(1, args.workers)
        for k in range(workers):
            copy_tree(tree(k))
        print(f"mutation: running the unmutated tests in {workers} copies of the tree", file=sys.stderr)
        with ProcessPoolExecutor(workers) as pool:
            timings = list(pool.map(baseline, range(workers), [targets] * workers))
        for target in targets:
            target.baseline_s = max(t[target.name] for t in timings)
            target.test_s = test_seconds(target, workers)
            print(f"mutation: {target.name}: tests take {target.baseline_s:.0f} s unmutated; a mutant's limit at most {target.timeout_s(None):.0f} s",
                  file=sys.stderr)
        run_mutants(targets, workers, args.minutes, again)
    text = report(collect(targets))
    if args.report is not None:
        write_report(args.report, text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
