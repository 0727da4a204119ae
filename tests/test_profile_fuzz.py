"""Hostile profiles and flags for `python -m harness.profile` (docs/reliability.md, "The profile importer").

The fuzz starts from traces the importer reads well (a Kineto trace built by hand, a real Kineto trace,
a real torch_npu trace), gives a few events hostile values in one or two fields (NaN and infinite
numbers as text, 2**64, negative times, wrong types, nested lists, empty names) and maybe one of the
file's top-level fields the reader uses (distributedInfo, deviceProperties), optionally wraps the
result in gzip (whole, cut short, inflating past the read limit) and runs the command on it. The rule,
as for the config fuzz: refused in one line naming the file or the flag with exit status 2 and nothing
written, or imported with every number of profile.json and ops.csv finite. A traceback, another exit
status or a NaN fails the test.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import compose_run
from synthetic_trace import Layout, kineto_trace
from test_reliability import FUZZ, record

import harness.importers.events as events
from harness.cli.command import check_run
from harness.cli.profile import main as profile_main

TRACES = Path(__file__).parent / "data" / "traces"
BASES = {
    "kineto (by hand)": kineto_trace(Layout(steps=3, ops=4, companions=True)),
    "kineto (HTA, A100)": json.loads(gzip.decompress((TRACES / "hta_event_sync_multistream_a100.json.gz").read_bytes())),
    "torch_npu (msprof-analyze)": json.loads(gzip.decompress((TRACES / "ascend_msprof_analyze_ut.json.gz").read_bytes())),
}
FIELDS = ["ts", "dur", "ph", "pid", "tid", "name", "cat", "id", "args", "args.correlation", "args.External id",
          "args.stream", "args.device", "args.Ev Idx", "bp"]
HOSTILE = st.one_of(
    st.sampled_from(["nan", "NaN", "inf", "-inf", "1e400", "", " ", "0x10", "12abc", "1704161511422904.204.1", "∞"]),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 2**63, 2**64, -(2**63) - 1, 10**30, -1, 0, -0.5]),
    st.sampled_from([None, True, [], {}, [[[]]], {"a": {"b": [1]}}, "x" * 10_000]),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)


def _events(trace: dict | list) -> list:
    return trace["traceEvents"] if isinstance(trace, dict) else trace


@st.composite
def hostile_traces(draw):
    """A recipe (small to print when it fails): the base trace, the changes to its events, the packing."""
    base = draw(st.sampled_from(sorted(BASES)))
    size = len(_events(BASES[base]))
    changes = draw(st.lists(st.tuples(st.integers(0, size - 1), st.sampled_from(FIELDS), HOSTILE), min_size=1, max_size=3))
    replaced = draw(st.one_of(st.none(), st.sampled_from([{}, [], "events", [[1, 2]], [None], 7])))  # the whole list
    # A top-level field the Kineto reader uses (a list as distributedInfo, a number as deviceProperties were tracebacks).
    top = draw(st.one_of(st.none(), st.tuples(st.sampled_from(["distributedInfo", "deviceProperties"]), HOSTILE)))
    packing = draw(st.sampled_from(["plain"] * 4 + ["gzip", "gzip cut short", "gzip past the limit", "garbage after"]))  # mostly the readers
    cut = draw(st.integers(2, 60)) if packing == "gzip cut short" else draw(st.binary(min_size=1, max_size=20)) if packing == "garbage after" else None
    return base, changes, replaced, packing, cut, top


def trace_bytes(base: str, changes: list, replaced, packing: str, cut, top=None) -> tuple[bytes, int]:
    """The file a recipe makes, and the read limit (MiB) to give the command."""
    trace = json.loads(json.dumps(BASES[base]))  # a copy
    items = _events(trace)
    for index, field, value in changes:
        event = items[index]
        if field.startswith("args."):
            if not isinstance(event.get("args"), dict):
                event["args"] = {}
            event["args"][field[5:]] = value
        else:
            event[field] = value
    if replaced is not None and isinstance(trace, dict):
        trace["traceEvents"] = replaced
    if top is not None and isinstance(trace, dict):
        trace[top[0]] = top[1]
    data, limit_mb = json.dumps(trace, allow_nan=True).encode(), events.READ_LIMIT_MB
    if packing == "gzip":
        data = gzip.compress(data, 1)
    elif packing == "gzip cut short":
        data = gzip.compress(data, 1)[:cut]
    elif packing == "gzip past the limit":
        data, limit_mb = gzip.compress(data + b" " * (2 << 20), 1), 1
    elif packing == "garbage after":
        data += cut
    return data, limit_mb


def run_profile(args: list[str]) -> tuple[int, str]:
    """`python -m harness.profile ARGS` in this process: (exit status, stderr)."""
    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            profile_main(args)
        except SystemExit as exit_:
            code = exit_.code
    return code, err.getvalue()


def assert_refused_in_one_line(code: int, err: str, names: str, out: Path) -> str:
    lines = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and len(lines) == 1, f"exit {code}: {err[-3000:]}"
    assert lines[0].startswith("hostbound: error: ") and names in lines[0], lines[0]
    assert not out.exists() or not any(out.iterdir()), "a refused import wrote files"
    return lines[0]


def assert_sane_import(out: Path) -> None:
    """profile.json holds only finite numbers, and the op list is one the harness reads back (every
    column within its range, checked as `workload=trace` checks it)."""
    measured = json.loads((out / "profile.json").read_text(), parse_constant=lambda c: pytest.fail(f"profile.json holds {c}"))
    assert math.isfinite(measured["step_ms_mean"]) and measured["step_ms_mean"] >= 0
    ops = pd.read_csv(out / "ops.csv")
    numbers = ops.select_dtypes("number").to_numpy(dtype=float)
    assert not np.isinf(numbers).any(), "ops.csv holds an infinite number"
    check_run(compose_run("workload=trace", f"workload.path={out / 'ops.csv'}", "workload.steps=2"))


@FUZZ
@given(case=hostile_traces())
def test_fuzzed_profiles_are_refused_naming_the_file_or_imported_sanely(case, tmp_path_factory):
    data, limit_mb = trace_bytes(*case)
    described = f"{case[0]}: {case[1]!r:.200} {case[3]} {case[5]!r:.100}"
    folder = tmp_path_factory.mktemp("trace")
    trace = folder / "trace.json"
    trace.write_bytes(data)
    out = folder / "out"
    code, err = run_profile([str(trace), "--out", str(out), "--max-read-mb", str(limit_mb)])
    assert "Traceback" not in err, f"{described}: {err[-3000:]}"
    if code != 0:
        line = assert_refused_in_one_line(code, err, str(trace), out)
        record("profile", "refused", f"{described} -> {line.split(': ', 3)[-1][:80]}")
        return
    assert_sane_import(out)
    record("profile", "imported", described)


FLAG_VALUES = {
    "--keep": st.one_of(st.sampled_from(["::0", "1:2:0", ":", "::", "5:2", "-1:", "a:b", "1.5:2", "99999999999999999999:", "", " ", "1:2:3:4", "0x1:"]),
                        st.text(max_size=8)),
    "--steps": st.one_of(st.sampled_from(["mark=", "from=", "mark=nosuch", "auto ", "AUTO", "graph", "sync", "profiler", "whole", "="]),
                         st.text(max_size=8)),
    "--rank": st.one_of(st.sampled_from(["-1", "0", "1", "abc", "1e3", "99999999999999999999999", ""]), st.text(max_size=5)),
    "--max-read-mb": st.one_of(st.sampled_from(["0", "-1", "1", "1048577", "1e3", "nan", "inf", ""]), st.text(max_size=5)),
    "--fit": st.one_of(st.sampled_from(["../x", "a/b", "", "h100", "1abc", "x" * 300, "ok_name"]), st.text(max_size=8)),
}


@FUZZ
@given(flag=st.sampled_from(sorted(FLAG_VALUES)), data=st.data())
def test_fuzzed_flags_are_refused_naming_the_flag_or_imported_sanely(flag, data, tmp_path_factory):
    value = data.draw(FLAG_VALUES[flag])
    folder = tmp_path_factory.mktemp("flags")
    out = folder / "out"
    with contextlib.chdir(folder):  # --fit writes conf/hardware/NAME.yaml in the launch folder
        code, err = run_profile([str(TRACES / "hta_event_sync_multistream_a100.json.gz"), "--out", str(out), f"{flag}={value}"])
    assert "Traceback" not in err, f"{flag}={value!r}: {err[-3000:]}"
    if code != 0:
        line = assert_refused_in_one_line(code, err, "", out)
        assert flag in line or "hta_event_sync" in line, line  # the flag, or the file the flag's value was applied to
        record("profile flags", "refused", f"{flag}={value!r}")
        return
    assert_sane_import(out)
    record("profile flags", "imported", f"{flag}={value!r}")


@pytest.mark.parametrize("content,says", [
    (b'{"traceEvents":' + b"[" * 10_000, "nested deeper than"),
    (gzip.compress(b" " * (3 << 20)), "inflates to more than --max-read-mb 2"),
    (b" " * (3 << 20), "larger than --max-read-mb 2"),
    (b'{"traceEvents": [{"ph": "X", "ts": "nan", "dur": 1, "pid": 1, "tid": 1, "name": "k", "cat": "kernel"}]}', "ts"),
], ids=["10,000 levels", "gzip bomb", "too large", "ts nan"])
def test_the_issue_cases_are_refused_in_one_line(content, says, tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_bytes(content)
    code, err = run_profile([str(trace), "--out", str(tmp_path / "out"), "--max-read-mb", "2"])
    assert says in assert_refused_in_one_line(code, err, str(trace), tmp_path / "out")


def test_a_device_that_never_ends_is_read_no_further_than_the_limit(tmp_path):
    code, err = run_profile(["/dev/zero", "--out", str(tmp_path / "out"), "--max-read-mb", "4"])
    assert "larger than --max-read-mb 4" in assert_refused_in_one_line(code, err, "/dev/zero", tmp_path / "out")
