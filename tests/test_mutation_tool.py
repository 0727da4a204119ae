"""tools/mutation/run.py's own logic (docs/testing.md): which mutants it does not make, which tests it
picks for a mutant, how it reads results and matches equivalent mutants. Running mutants takes hours;
these pieces take milliseconds."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.config.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tools" / "mutation"))
import run as mutation  # noqa: E402


def test_every_target_names_modules_and_test_files_that_exist():
    targets = mutation.load_targets([])
    assert {t.name for t in targets} >= {"engine", "lowering", "policies", "device", "metrics", "serving", "tracking", "ops", "importers"}
    for target in targets:
        assert target.modules and target.tests
        assert all((REPO_ROOT / m).is_file() for m in target.modules), target.name
        assert all((REPO_ROOT / t.split("::")[0]).is_file() for t in target.tests), target.name
        assert not any(t.startswith(("tests/test_repro.py", "tests/test_readme.py")) for t in target.tests)  # unit-level only
    with pytest.raises(SystemExit, match="no target nosuch"):
        mutation.load_targets(["nosuch"])


def test_message_text_and_annotations_are_not_mutated(tmp_path, monkeypatch):
    monkeypatch.setattr(mutation, "REPO", tmp_path)
    (tmp_path / "m.py").write_text(
        "def f(x: int | None = None) -> float:\n"
        "    log.info('%d items', x + 1)\n"
        "    y: list[int] = []\n"
        "    raise ValueError(f'x={x + 1}')\n"
    )
    spans = mutation.unmutated_spans("m.py")
    message, annotation = spans[mutation.SKIP_MESSAGE], spans[mutation.SKIP_ANNOTATION]
    assert ((2, 4), (2, 31)) in message and ((4, 21), (4, 33)) in message
    assert ((1, 9), (1, 19)) in annotation and ((1, 31), (1, 36)) in annotation and ((3, 7), (3, 16)) in annotation


def test_the_number_a_mutant_changes_is_read_from_its_position():
    spec = type("Spec", (), {"start_pos": (1, 4), "end_pos": (1, 7)})()
    assert mutation.number_at(["x = 1e9 + 2"], spec) == 1e9
    spec.start_pos, spec.end_pos = (1, 10), (1, 11)
    assert mutation.number_at(["x = 1e9 + 2"], spec) == 2.0


def test_a_mutant_is_reported_by_the_lines_it_changes_and_the_test_that_failed():
    diff = "--- a/m.py\n+++ b/m.py\n@@ -3 +3 @@\n-    if a < b:\n+    if a <= b:\n"
    assert mutation.changed_lines(diff) == ("if a < b:", "if a <= b:")
    output = "....F\n=== FAILURES ===\nFAILED tests/test_x.py::test_y[3-2] - AssertionError: no\n1 failed\n"
    assert mutation.killing_test(output) == "tests/test_x.py::test_y[3-2]"
    assert mutation.killing_test("timeout") == ""


def test_equivalent_mutants_match_by_their_lines_or_a_rule(tmp_path):
    path = tmp_path / "equivalent.toml"
    path.write_text(
        "[[rule]]\nreplace = ['.shape[0]', '.shape[ -1]']\nmodules = ['a.py']\nwhy = 'one-dimensional'\n\n"
        "[[mutant]]\nmodule = 'a.py'\nfunction = 'f'\nbefore = 'x = 1'\nafter = 'x = 2'\nwhy = 'never read'\n"
    )
    known = mutation.Equivalents(path)
    assert known.why("a.py", "f", "x = 1", "x = 2") == "never read"
    assert known.why("a.py", "g", "x = 1", "x = 2") is None  # another function
    assert known.why("a.py", "g", "n = a.shape[0] + b.shape[0]", "n = a.shape[0] + b.shape[ -1]") == "one-dimensional"
    assert known.why("b.py", "g", "n = a.shape[0]", "n = a.shape[ -1]") is None  # the rule holds in a.py only
    assert known.why("a.py", "g", "n = a.shape[0]", "n = a.shape[1]") is None


def coverage_of(tmp_path, monkeypatch, target, contexts: dict) -> "mutation.Coverage":
    """The tool's Coverage over m.py in tmp_path, with coverage contexts given by line."""
    monkeypatch.setattr(mutation, "REPO", tmp_path)
    monkeypatch.setattr(mutation, "tree", lambda k: tmp_path)
    reach = mutation.Coverage.__new__(mutation.Coverage)
    reach.target, reach.parsed = target, {}
    reach.data = type("Data", (), {"contexts_by_lineno": lambda self, path: contexts})()
    return reach


def test_the_tests_of_a_mutant_are_those_reaching_its_statement(tmp_path, monkeypatch):
    """A statement's tests are the coverage contexts of its lines (a compound statement's header only);
    a kernel's are those of the Python lines calling it; code that runs at import gets every test."""
    (tmp_path / "m.py").write_text(
        "from numba import njit\n"  # 1
        "LIMIT = 3\n"  # 2
        "@njit\n"  # 3
        "def _kernel(x):\n"  # 4
        "    return x + 1\n"  # 5
        "def f(x):\n"  # 6
        "    if x > 0:\n"  # 7
        "        return _kernel(x)\n"  # 8
        "    return 0\n"  # 9
    )
    target = mutation.Target("t", ["m.py"], ["tests/test_b.py", "tests/test_a.py"])
    contexts = {7: {"tests/test_a.py::test_one|run", "tests/test_b.py::test_two[1]|run"}, 8: {"tests/test_a.py::test_one|run"}, 9: {""}}
    reach = coverage_of(tmp_path, monkeypatch, target, contexts)
    assert reach.tests_for("m.py", 7) == ["tests/test_b.py::test_two", "tests/test_a.py::test_one"]  # targets.toml's file order
    assert reach.tests_for("m.py", 5) == ["tests/test_a.py::test_one"]  # the kernel, through line 8 (test files not written yet)
    assert reach.tests_for("m.py", 9) == []  # reached only outside any test: no test to run
    assert reach.tests_for("m.py", 2) is None  # module level: every test
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_b.py").write_text("from m import _kernel\n\ndef test_direct():\n    assert _kernel(1) == 2\n")
    (tmp_path / "tests" / "test_a.py").write_text("def test_one():\n    pass\n")
    assert reach.tests_for("m.py", 5) == ["tests/test_b.py", "tests/test_a.py::test_one"]  # test_b.py calls the kernel itself
    target.reach_all = True
    assert reach.tests_for("m.py", 7) is None


def test_a_default_on_a_continuation_line_of_a_def_runs_at_import(tmp_path, monkeypatch):
    """`def g(x,\n      y=1):` evaluates y's default with the `def`, at import: its mutants run every test.
    They were taken for lines inside g that no test reaches, and never ran (12 of workload.py's)."""
    (tmp_path / "m.py").write_text(
        "def g(x,\n"  # 1
        "      y=1):\n"  # 2
        "    return x + y\n"  # 3
        "h = lambda a, b=2: (\n"  # 4
        "    a + b)\n"  # 5
    )
    target = mutation.Target("t", ["m.py"], ["tests/test_a.py"])
    reach = coverage_of(tmp_path, monkeypatch, target, {3: {"tests/test_a.py::test_one|run"}, 5: {"tests/test_a.py::test_one|run"}})
    assert reach.tests_for("m.py", 2) is None  # the signature: every test
    assert reach.tests_for("m.py", 3) == ["tests/test_a.py::test_one"]  # the body: its tests
    assert reach.tests_for("m.py", 5) == ["tests/test_a.py::test_one"]  # a lambda's body


def test_a_line_run_while_a_test_was_set_up_runs_that_tests_file(tmp_path, monkeypatch):
    """A module-scoped fixture runs in the setup of the first test using it: coverage credits that test
    alone, though every test of the file may use what it built."""
    monkeypatch.setattr(mutation, "REPO", tmp_path)
    monkeypatch.setattr(mutation, "tree", lambda k: tmp_path)
    (tmp_path / "m.py").write_text("def f(x):\n    y = x + 1\n    return y\n")
    contexts = {2: {"tests/test_a.py::test_one|setup", "tests/test_a.py::test_two|run", "tests/test_b.py::test_three|run"}}
    reach = coverage_of(tmp_path, monkeypatch, mutation.Target("t", ["m.py"], ["tests/test_a.py", "tests/test_b.py"]), contexts)
    assert reach.tests_for("m.py", 2) == ["tests/test_a.py", "tests/test_b.py::test_three"]


def test_a_mutants_time_limit_follows_its_tests():
    target = mutation.Target("t", ["m.py"], ["tests/test_a.py"], baseline_s=100.0, test_s={"tests/test_a.py::f": 2.0, "tests/test_a.py::g": 3.0})
    assert target.timeout_s(["tests/test_a.py::f", "tests/test_a.py::g"]) == mutation.TIMEOUT_FACTOR * 5 + mutation.TIMEOUT_EXTRA_S
    assert target.timeout_s(None) == mutation.TIMEOUT_FACTOR * 100 + mutation.TIMEOUT_EXTRA_S
    assert target.command(["tests/test_a.py::f"]).endswith("tools/mutation/pytest_mutant.py tests/test_a.py::f")


def test_the_results_section_of_the_doc_is_replaced_in_place(tmp_path):
    doc = tmp_path / "testing.md"
    doc.write_text(f"# T\n\nbefore\n{mutation.BEGIN}\nold\n{mutation.END}\nafter\n")
    mutation.write_report(doc, "new")
    assert doc.read_text() == f"# T\n\nbefore\n{mutation.BEGIN}\nnew\n{mutation.END}\nafter\n"
    (tmp_path / "plain.md").write_text("no section")
    with pytest.raises(SystemExit, match="no results section"):
        mutation.write_report(tmp_path / "plain.md", "new")


def test_the_score_leaves_equivalent_mutants_out():
    tally = mutation.Tally([mutation.Mutant("m.py", "f", 1, "op", "a", "b", outcome) for outcome in
                            ["killed"] * 8 + ["timeout", "survived", "uncovered", "equivalent", "equivalent"]], not_run=5)
    assert tally.score == pytest.approx(9 / 11)
    text = mutation.report({"t": tally, "u": mutation.Tally(not_run=2)})
    assert "| t | 13 | 8 | 1 | 1 | 1 | 2 | 81.8% | 5 |" in text
    assert "| **all** | 13 | 8 | 1 | 1 | 1 | 2 | 81.8% | 7 |" in text
    assert Path(mutation.__file__).parent == REPO_ROOT / "tools" / "mutation"


def test_results_are_read_from_the_session_with_the_mutants_not_run_yet(tmp_path, monkeypatch):
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import MutationSpec, TestOutcome, WorkerOutcome, WorkItem, WorkResult

    monkeypatch.setattr(mutation, "session_file", lambda module: tmp_path / "m.sqlite")
    diff = "--- a\n+++ b\n-    return a < b\n+    return a <= b\n"
    with use_db(str(tmp_path / "m.sqlite"), WorkDB.Mode.create) as db:
        for k, line in enumerate((3, 4, 5)):
            db.add_work_item(WorkItem.single(f"job{k}", MutationSpec("m.py", "core/ReplaceComparisonOperator_Lt_LtE", k, (line, 4), (line, 9),
                                                                     definition_name="f")))
        db.set_result("job0", WorkResult(WorkerOutcome.NORMAL, "FAILED tests/test_x.py::test_y - assert", TestOutcome.KILLED, diff))
        db.set_result("job1", WorkResult(WorkerOutcome.NORMAL, "", TestOutcome.SURVIVED, diff))
    target = mutation.Target("t", ["m.py"], ["tests/test_x.py"])
    tally = mutation.collect([target])["t"]
    assert [(m.line, m.outcome, m.killed_by, m.before, m.after) for m in tally.mutants] == [
        (3, "killed", "tests/test_x.py::test_y", "return a < b", "return a <= b"),
        (4, "survived", "", "return a < b", "return a <= b"),
    ]
    assert tally.not_run == 1


def test_a_continue_that_coverage_never_reports_gets_the_tests_of_its_if(tmp_path, monkeypatch):
    """CPython folds `if …: continue` into the condition's jump: the continue's line never reports."""
    (tmp_path / "m.py").write_text(
        "def f(xs):\n"  # 1
        "    for x in xs:\n"  # 2
        "        if x is None:\n"  # 3
        "            continue\n"  # 4
        "        if x > 9:\n"  # 5
        "            break\n"  # 6
        "        print(x)\n"  # 7
    )
    contexts = {2: {"tests/test_a.py::test_one|run"}, 3: {"tests/test_a.py::test_one|run"}, 5: {"tests/test_a.py::test_two|run"}}
    reach = coverage_of(tmp_path, monkeypatch, mutation.Target("t", ["m.py"], ["tests/test_a.py"]), contexts)
    assert reach.tests_for("m.py", 4) == ["tests/test_a.py::test_one"]
    assert reach.tests_for("m.py", 6) == ["tests/test_a.py::test_two"]
    assert reach.tests_for("m.py", 7) == []  # a plain statement keeps its own lines


def test_retesting_forgets_the_survivors_not_judged_equivalent(tmp_path, monkeypatch):
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import MutationSpec, TestOutcome, WorkerOutcome, WorkItem, WorkResult

    monkeypatch.setattr(mutation, "session_file", lambda module: tmp_path / "m.sqlite")
    (tmp_path / "equivalent.toml").write_text("[[mutant]]\nmodule = 'm.py'\nfunction = 'f'\nbefore = 'x = 1'\nafter = 'x = 2'\nwhy = 'never read'\n")
    diffs = {"job0": ("x = 1", "x = 2"), "job1": ("y = 1", "y = 2"), "job2": ("z = 1", "z = 2")}
    with use_db(str(tmp_path / "m.sqlite"), WorkDB.Mode.create) as db:
        for k, (job, (before, after)) in enumerate(diffs.items()):
            db.add_work_item(WorkItem.single(job, MutationSpec("m.py", "core/NumberReplacer", k, (k + 1, 4), (k + 1, 5), definition_name="f")))
            outcome = TestOutcome.KILLED if job == "job2" else TestOutcome.SURVIVED
            db.set_result(job, WorkResult(WorkerOutcome.NORMAL, "", outcome, f"--- a\n+++ b\n-    {before}\n+    {after}\n"))
    monkeypatch.setattr(mutation, "first_file", lambda module: tmp_path / "m.first.json")
    (tmp_path / "m.first.json").write_text('["job2", "job9"]')  # forgotten before: job2 has run since, job9 not
    assert mutation.forget_survivors("m.py", mutation.Equivalents(tmp_path / "equivalent.toml")) == {"job1", "job9"}
    with use_db(str(tmp_path / "m.sqlite"), WorkDB.Mode.open) as db:
        assert sorted(item.job_id for item in db.pending_work_items) == ["job1"]


def test_every_equivalent_mutant_names_a_line_its_module_still_has():
    """An entry whose line the code no longer has matches no mutant: 19 had piled up (a function rewritten,
    a line moved into another), each still counted in what the file claims. Removed with its code, or
    written again for the line that replaced it."""
    stale = [(m["module"], m["function"], m["before"]) for m in mutation.toml.load(mutation.EQUIVALENT_FILE)["mutant"]
             if m["before"].strip() not in (REPO_ROOT / m["module"]).read_text()]
    assert stale == []
