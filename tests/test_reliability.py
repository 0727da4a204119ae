"""Hostile input, broken stores, full disks (issue 14): one clear line, nothing lost, never a hang.

The fuzz tests draw values for every number the config and the trace CSVs take (hypothesis, a few dozen
examples by default; HOSTBOUND_FUZZ_EXAMPLES=2000 for a large run) and hold the harness to one rule:
either it refuses (exit 2, one line naming the key or the file, nothing written) or it runs and every
number it reports is finite and within its physical range. The other tests break the tracking store,
the output folder and the disk on purpose.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import resource
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import compose_run, free_port, run_cli
from harness.cli.command import check_run, preflight
from harness.config.limits import LIMITS, Limit
from harness.base.errors import EXIT_BAD_INPUT, EXIT_WRITE_FAILED, ConfigError
from harness.base.files import atomic_write
from harness.cli.job import execute
from harness.model.ops_csv import COLUMN_LIMITS, INT_COLUMNS
from harness.base.errors import EXIT_TRACKING_FAILED
from harness.tracking.store import FAILED_FILE
from harness.model.workload import load_card

FUZZ_EXAMPLES = int(os.environ.get("HOSTBOUND_FUZZ_EXAMPLES", "30"))
# HOSTBOUND_FUZZ_REPORT=FILE appends one line per example (test, outcome, input): the counts in docs/reliability.md.
FUZZ_REPORT = os.environ.get("HOSTBOUND_FUZZ_REPORT")


def record(test: str, outcome: str, case: str) -> None:
    if FUZZ_REPORT:
        with open(FUZZ_REPORT, "a") as report:
            report.write(f"{test}\t{outcome}\t{case}\n")
FUZZ = settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
# Small and quick unless the key under test is one of these.
BASE = {"workload.steps": "3", "output.trace_steps": "0", "output.timeline_steps": "0", "tracking.enabled": "false"}


def _config_keys() -> list[str]:
    """Every numeric key a command line can set: the schema's, and the default card's fields."""
    card = load_card("llama2_7b")
    keys = [k for k in LIMITS if not k.startswith(("card.", "workload.ops[]"))]
    return keys + [f"+workload.card_overrides.{k.removeprefix('card.')}" for k in LIMITS if k.startswith("card.") and k.removeprefix("card.") in card]


CONFIG_KEYS = _config_keys()


def _limit_of(key: str) -> Limit:
    name = key.lstrip("+")
    return LIMITS[f"card.{name.rsplit('.', 1)[1]}" if "card_overrides" in name else name]


def hostile_numbers(limit: Limit):
    """Values a careless or unlucky user types: non-finite, huge, tiny, negative, just outside the range."""
    edges = [limit.low, limit.high, limit.low - 1, limit.high + 1, limit.high * 10, limit.low / 2]
    return st.one_of(
        st.sampled_from([math.inf, -math.inf, math.nan, 1e308, -1e308, 2**63, -(2**63), 2**64, 0, -1, 1e-300, 0.5, 7]),
        st.sampled_from(edges),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from(["abc", "", "[1]", "{a: 1}", "null", "true", "1e", "0x10"]),
    )


def _render(value) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return value if value in ("[1]", "{a: 1}", "null", "true", "") else f"'{value}'"
    return str(value)


@st.composite
def config_overrides(draw):
    key = draw(st.sampled_from(CONFIG_KEYS))
    value = draw(hostile_numbers(_limit_of(key)))
    rendered = _render(value)
    if key.endswith("graph.buckets"):
        rendered = f"[{rendered}]"
    return key, rendered


def _finite_json(text: str) -> dict:
    def refuse(constant: str):
        raise AssertionError(f"summary.json holds {constant}")

    return json.loads(text, parse_constant=refuse)


def assert_sane_summary(summary: dict) -> None:
    """What a user may trust of any run that exits 0."""
    for key, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert math.isfinite(value), f"{key}={value}"
    assert summary["throughput_tok_s"] > 0
    assert summary["step_ms_mean"] > 0
    for key in ("bubble_ratio", "device_busy", "host_busy_max"):
        assert -1e-9 <= summary[key] <= 1 + 1e-9, f"{key}={summary[key]}"
    breakdown = [v for k, v in summary.items() if k.startswith("breakdown_")]
    assert breakdown and abs(sum(breakdown) - 1) < 1e-6, breakdown


def check_refused_or_sane(overrides: list[str], folder: Path) -> str:
    """Run the command line's checks on `overrides`; on refusal assert one line, status 2 and no folder,
    else simulate and write the run and assert its summary. Returns 'refused' or 'ran'."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            preflight([*overrides, f"hydra.run.dir={folder}"])
        except SystemExit as exc:
            lines = err.getvalue().strip().splitlines()
            assert exc.code == EXIT_BAD_INPUT, err.getvalue()
            assert len(lines) == 1 and lines[0].startswith("hostbound: error: "), err.getvalue()
            assert not folder.exists(), "a refused run left its folder"
            return "refused"
    run = compose_run(*[o for o in overrides if not o.startswith("hydra.")])
    execute(run, folder, params={})
    assert_sane_summary(_finite_json((folder / "summary.json").read_text()))
    return "ran"


@FUZZ
@given(override=config_overrides())
def test_fuzzed_config_numbers_are_refused_in_one_line_or_run_sanely(override, tmp_path_factory):
    key, value = override
    overrides = {k: v for k, v in BASE.items() if k != key.lstrip("+")}
    line = f"{key}={value}"
    outcome = check_refused_or_sane([f"{k}={v}" for k, v in overrides.items()] + [line], tmp_path_factory.mktemp("fuzz") / "run")
    record("config", outcome, line)
    if outcome == "refused":
        return
    limit = _limit_of(key)
    try:
        number = float(value.strip("'"))
    except ValueError:  # text that a key took as its type (e.g. 'true' for a number key is refused): nothing to compare
        return
    assert limit.low <= number <= limit.high, f"{line} ran although outside {limit.text()}"


def _text_keys() -> list[str]:
    """Every text and choice key of the schema (names, paths, URIs, enums), by walking RunConfig."""
    import dataclasses
    import enum
    import typing

    from harness.config.schema import RunConfig

    keys = []

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            leaves = typing.get_args(hint) or (hint,)
            key = f"{prefix}{f.name}"
            if typing.get_origin(hint) is dict or key == "workload.ops":
                continue
            if any(dataclasses.is_dataclass(t) for t in leaves):
                walk(next(t for t in leaves if dataclasses.is_dataclass(t)), key + ".")
            elif any(t is str or (isinstance(t, type) and issubclass(t, enum.Enum)) for t in leaves):
                keys.append(key)

    walk(RunConfig, "")
    return keys


TEXT_KEYS = _text_keys()


def _quoted(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@FUZZ
@given(key=st.sampled_from(TEXT_KEYS), value=st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "../../etc/passwd", "/proc/self/environ", "/dev/zero", "x" * 5000, "${oc.env:HOME}", "${nope}",
                     "a\nb", "tab\there", "nul\x00", "héllo/wörld", "C:\\temp", "sqlite:///", "http://", "-1", "inf"]),
))
def test_fuzzed_text_and_choices_are_refused_in_one_line_or_run_sanely(key, value, tmp_path_factory):
    overrides = [f"{k}={v}" for k, v in BASE.items() if k != key]
    line = f"{key}={_quoted(value)}"
    outcome = check_refused_or_sane([*overrides, line], tmp_path_factory.mktemp("text") / "run")
    record("text", outcome, repr(line)[:120])


# The issue's own cases, each named.
ISSUE_CASES = [
    ("hardware.device.hbm_gbps=inf", "hardware.device.hbm_gbps=inf"),
    ("hardware.device.cube_tflops=inf", "hardware.device.cube_tflops"),
    ("hardware.link.pcie_gbps=inf", "hardware.link.pcie_gbps"),
    ("workload.serving.arrival_rate_rps=inf", "workload.serving.arrival_rate_rps"),
    ("hardware.host.framework_us=1e308", "hardware.host.framework_us"),
    ("hardware.host.sync_us=1e308", "hardware.host.sync_us"),
    ("hardware.host.threads=9223372036854775808", "hardware.host.threads"),
    ("hardware.host.launch_us=inf", "hardware.host.launch_us"),
    ("workload.tp=9223372036854775808", "workload.tp"),
    ("workload.steps=1e9", "workload.steps"),
    ("workload.steps=1000000000", "workload.steps"),
    ("+workload.card_overrides.num_hidden_layers=1e9", "workload.card_overrides.num_hidden_layers"),
    ("+workload.card_overrides.head_dim=-1", "workload.card_overrides.head_dim"),
    ("+workload.card_overrides.head_dim=abc", "workload.card_overrides.head_dim"),
    ("+workload.card_overrides.head_dim=inf", "workload.card_overrides.head_dim"),
    ("hardware.device.hbm_efficiency=nan", "hardware.device.hbm_efficiency"),
    ("strategy.graph.buckets=[8,0]", "strategy.graph.buckets[1]"),
    ("tracking.uri=foo://bar", "tracking.uri"),
    ("tracking.timeout_s=0", "tracking.timeout_s"),
]


@pytest.mark.parametrize("override,named", ISSUE_CASES, ids=[c[0] for c in ISSUE_CASES])
def test_issue_cases_are_refused_up_front_naming_the_key(override, named, tmp_path):
    err = io.StringIO()
    folder = tmp_path / "run"
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        preflight([override, f"hydra.run.dir={folder}"])
    assert exc.value.code == EXIT_BAD_INPUT
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and named in lines[0], lines
    assert not folder.exists()


def test_every_number_of_the_schema_has_a_limit_and_no_limit_is_stale():
    """A new numeric key without a range would pass unchecked: check_limits looks each one up."""
    from harness.config.limits import _numeric_fields
    from harness.config.advise import AdviseConfig
    from harness.config.schema import RunConfig
    import dataclasses
    import typing

    found = set()

    def walk(cls, key):
        hints = typing.get_type_hints(cls)
        for name, _ in _numeric_fields(cls):
            found.add(f"{key}.{name}" if key else name)
        for f in dataclasses.fields(cls):
            inner = [t for t in typing.get_args(hints[f.name]) or [hints[f.name]] if dataclasses.is_dataclass(t)]
            for t in inner:
                walk(t, f"{key}.{f.name}" if key else f.name)

    walk(RunConfig, "")
    walk(AdviseConfig, "advise")  # python -m harness.advise's question
    found = {k.replace("workload.ops.", "workload.ops[].") for k in found}
    configured = {k for k in LIMITS if not k.startswith("card.")}
    assert found == configured
    assert all(math.isfinite(limit.low) and math.isfinite(limit.high) and limit.low <= limit.high for limit in LIMITS.values())


def test_a_card_file_is_checked_like_the_config(tmp_path, monkeypatch):
    import harness.config.paths as config_module
    import harness.model.workload as workload_module

    cards = tmp_path / "workloads"
    cards.mkdir()
    text = (config_module.WORKLOADS_DIR / "llama2_7b.yaml").read_text()
    (cards / "bad.yaml").write_text(text.replace("head_dim: 128", "head_dim: .inf"))
    (cards / "typo.yaml").write_text(text.replace("vocab_size:", "vocab_sise:"))
    monkeypatch.setattr(workload_module, "WORKLOADS_DIR", cards)
    with pytest.raises(ConfigError, match=r"workloads/bad.yaml head_dim=inf: must be an integer in 1\.\.1048576"):
        load_card("bad")
    with pytest.raises(ConfigError, match="workloads/typo.yaml vocab_sise: not a card field .did you mean vocab_size"):
        load_card("typo")

# ---------------------------------------------------------------- trace CSVs

NUMERIC_COLUMNS = sorted(COLUMN_LIMITS)


@st.composite
def csv_files(draw):
    """A few rows of an op list, with one or two columns given hostile values."""
    rows = draw(st.integers(1, 4))
    frame = {"name": [f"op{i}" for i in range(rows)], "kind": draw(st.lists(st.sampled_from(["cube", "vector", "comm", "copy", "host"]), min_size=rows, max_size=rows))}
    frame["device_us"] = [str(draw(st.floats(0.5, 50))) for _ in range(rows)]
    for column in draw(st.lists(st.sampled_from([c for c in NUMERIC_COLUMNS if c not in ("step", "group")]), min_size=1, max_size=2, unique=True)):
        values = draw(st.lists(hostile_numbers(COLUMN_LIMITS[column]), min_size=rows, max_size=rows))
        frame[column] = [_csv_text(v, column in INT_COLUMNS) for v in values]
    return pd.DataFrame(frame)


def _csv_text(value, integer: bool) -> str:
    if isinstance(value, float) and integer and math.isfinite(value) and value == int(value) and abs(value) < 1e18:
        return str(int(value))
    return value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)


@FUZZ
@given(frame=csv_files())
def test_fuzzed_trace_csvs_are_refused_naming_the_file_or_run_sanely(frame, tmp_path_factory):
    folder = tmp_path_factory.mktemp("csv")
    path = folder / "ops.csv"
    frame.to_csv(path, index=False)
    run = compose_run("workload=trace", f"workload.path={path}", *[f"{k}={v}" for k, v in BASE.items()])
    try:
        check_run(run)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"workload.path={str(path)!r}"), message
        record("csv", "refused", message.split(": ", 1)[0].split(" ", 1)[-1])
        return
    execute(run, folder / "run", params={})
    assert_sane_summary(_finite_json((folder / "run" / "summary.json").read_text()))
    record("csv", "ran", " ".join(frame.columns))


def test_trace_files_over_the_limits_are_refused_before_they_are_simulated(tmp_path, monkeypatch):
    import harness.model.ops_csv as trace_io

    path = tmp_path / "ops.csv"
    path.write_text("name,kind,device_us\n" + "".join(f"op{i},vector,2\n" for i in range(50)))
    run = compose_run("workload=trace", f"workload.path={path}")
    monkeypatch.setattr(trace_io, "MAX_ROWS", 40)
    with pytest.raises(ConfigError, match="50 rows, over the 40"):
        check_run(run)
    monkeypatch.setattr(trace_io, "MAX_FILE_BYTES", 100)
    with pytest.raises(ConfigError, match="over the 0 GB"):
        check_run(run)


def test_a_trace_too_large_for_memory_is_refused_naming_the_file(tmp_path, monkeypatch):
    import harness.sim.simulate as run_module

    path = tmp_path / "ops.csv"
    path.write_text("name,kind,device_us\n" + "".join(f"op{i},vector,2\n" for i in range(100)))
    monkeypatch.setattr(run_module, "available_memory_bytes", lambda: run_module.BASE_MEMORY_BYTES + 100 * 10 * run_module.BYTES_PER_OP_STEP)
    run = compose_run("workload=trace", f"workload.path={path}", "workload.steps=32")
    with pytest.raises(ConfigError, match=r"workload.path=.*ops.csv.*100 ops/step × 32 steps.*about 10 steps fit"):
        check_run(run)


@pytest.mark.parametrize("repeat,warmup,steps", [(1, 8, "4 step(s)"), (1, 4, "4 step(s)"), (2, 8, "4 step(s)")])
def test_warmup_past_a_trace_csvs_steps_is_refused_not_cut(repeat, warmup, steps, tmp_path):
    """A CSV's `step` column sets the steps, not workload.steps: a warm-up as long as them was cut to
    steps - 1 without a word (4 steps, warmup_steps=8: 1 step measured, summary.json said warmup 8).
    Refused as workload.steps' own limit is, naming the key and the file's steps, before a folder."""
    path = tmp_path / "ops4.csv"
    path.write_text("step,name,kind,device_us\n" + "".join(f"{s},mm,cube,100\n{s},add,vector,10\n" for s in range(4)))
    folder = tmp_path / "run"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        preflight(["workload=trace", f"workload.path={path}", f"workload.warmup_steps={warmup}", f"workload.repeat={repeat}",
                   f"hydra.run.dir={folder}"])
    assert exc.value.code == EXIT_BAD_INPUT
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"hostbound: error: workload.warmup_steps={warmup}: must be < the {steps} of workload.path="), lines
    assert not folder.exists()
    run = compose_run("workload=trace", f"workload.path={path}", "workload.warmup_steps=3", f"workload.repeat={repeat}")
    check_run(run)  # the last step measured: runs


def test_trace_json_is_capped(monkeypatch):
    import harness.results.outputs as outputs
    from harness.sim.simulate import simulate_run

    outcome = simulate_run(compose_run("workload.steps=3"))
    full = outputs.chrome_trace(outcome, 2)["traceEvents"]
    monkeypatch.setattr(outputs, "MAX_TRACE_EVENTS", 1000)
    capped = outputs.chrome_trace(outcome, 2)["traceEvents"]
    assert len([e for e in full if e["ph"] == "X"]) > 1000
    assert len([e for e in capped if e["ph"] == "X"]) == 1000


# ---------------------------------------------------------------- tracking stores


@pytest.mark.slow
def test_a_store_that_is_down_costs_nothing_but_the_logging(tmp_path):
    """Nothing listens: the run ends in seconds with its files, one line, status 3; `harness.tracking
    log` logs it afterwards, once."""
    port = free_port()
    began = time.monotonic()
    proc = run_cli(f"tracking.uri=http://127.0.0.1:{port}", f"hydra.run.dir={tmp_path / 'run'}", "workload.steps=3", cwd=tmp_path)
    assert proc.returncode == EXIT_TRACKING_FAILED, proc.stderr[-2000:]
    assert time.monotonic() - began < 60
    error = [line for line in proc.stderr.splitlines() if line.startswith("hostbound: error:")]
    assert len(error) == 1 and "tracking failed" in error[0] and "Connection refused" in error[0]
    assert "python -m harness.tracking log" in error[0]
    assert "throughput" in proc.stdout  # the summary is printed all the same
    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (run_dir / "steps.parquet").is_file() and (run_dir / FAILED_FILE).is_file()

    db = tmp_path / "later.db"
    log = [sys.executable, "-m", "harness.tracking", "log", str(run_dir), "--uri", f"sqlite:///{db}"]
    first = subprocess.run(log, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert first.returncode == 0 and "logged as run" in first.stdout, first.stderr[-2000:]
    assert not (run_dir / FAILED_FILE).exists()
    again = subprocess.run(log, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert again.returncode == 0 and "already in" in again.stdout
    with sqlite3.connect(db) as con:
        runs = con.execute("select run_uuid from runs").fetchall()
        throughput = con.execute("select value from latest_metrics where key='headline/throughput_tok_s'").fetchall()
        params = dict(con.execute("select key, value from params").fetchall())
    assert len(runs) == 1 and throughput[0][0] == pytest.approx(summary["throughput_tok_s"]) and params["workload.steps"] == str(summary["steps"])


@pytest.mark.slow
def test_a_store_that_never_answers_is_given_up_within_the_timeout(tmp_path):
    """A server that accepts the connection and says nothing: bounded by tracking.timeout_s, not minutes."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        port = server.getsockname()[1]
        began = time.monotonic()
        proc = run_cli(f"tracking.uri=http://127.0.0.1:{port}", "tracking.timeout_s=1", f"hydra.run.dir={tmp_path / 'run'}",
                       "workload.steps=3", "output.timeline_steps=0", cwd=tmp_path, timeout=110)
        elapsed = time.monotonic() - began
    assert proc.returncode == EXIT_TRACKING_FAILED, proc.stderr[-2000:]
    assert elapsed < 60, elapsed
    assert (tmp_path / "run" / "summary.json").is_file()


@pytest.mark.slow
def test_a_locked_store_fails_in_one_line_within_the_timeout_and_mlflows_words_go_to_the_log(tmp_path):
    """Another process holds the sqlite store's write lock: MLflow waited 20 s a write (its own busy
    timeout) and printed ~90 lines of SQL and traceback; now tracking.timeout_s, one line, and MLflow's
    record of it in the run folder's hostbound.log."""
    database = tmp_path / "mlflow.db"
    first = run_cli(f"tracking.uri=sqlite:///{database}", f"hydra.run.dir={tmp_path / 'first'}", "workload.steps=3",
                    "output.timeline_steps=0", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    holder = subprocess.Popen([sys.executable, "-c", f"import sqlite3, time\ncon = sqlite3.connect({str(database)!r}, isolation_level=None)\n"
                               "con.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\ntime.sleep(120)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        began = time.monotonic()
        proc = run_cli(f"tracking.uri=sqlite:///{database}", "tracking.timeout_s=1", f"hydra.run.dir={tmp_path / 'run'}",
                       "workload.steps=3", "output.timeline_steps=0", cwd=tmp_path, timeout=110)
        elapsed = time.monotonic() - began
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == EXIT_TRACKING_FAILED, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "[SQL:" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "database is locked" in errors[0] and str(database) in errors[0], errors
    assert elapsed < 15, f"{elapsed:.1f} s: MLflow's 20 s wait a write is back"
    assert "database is locked" in (tmp_path / "run" / "hostbound.log").read_text()
    assert (tmp_path / "run" / FAILED_FILE).is_file() and (tmp_path / "run" / "summary.json").is_file()


@pytest.mark.slow
def test_a_sweep_against_a_store_that_is_down_runs_every_job_and_says_so_once(tmp_path):
    port = free_port()
    proc = run_cli("-m", "strategy=eager,async", f"tracking.uri=http://127.0.0.1:{port}", "workload.steps=3",
                   "output.timeline_steps=0", "output.print_summary=false", "hydra.sweep.dir=sw", cwd=tmp_path, timeout=300)
    assert proc.returncode == EXIT_TRACKING_FAILED, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hostbound: error:")]
    assert len(errors) == 1 and "2 job(s)" in errors[0], errors
    jobs = sorted((tmp_path / "sw").glob("*_llama2_7b_decode_*"))
    assert len(jobs) == 2 and all((job / "summary.json").is_file() and (job / FAILED_FILE).is_file() for job in jobs)
    assert len(pd.read_csv(tmp_path / "sw" / "results.csv")) == 2
    assert f"python -m harness.tracking log {tmp_path / 'sw'}" in errors[0]
    db = tmp_path / "later.db"
    later = subprocess.run([sys.executable, "-m", "harness.tracking", "log", str(tmp_path / "sw"), "--uri", f"sqlite:///{db}"],
                           capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert later.returncode == 0 and later.stdout.count("logged as run") == 2, later.stderr[-2000:]
    assert not any((job / FAILED_FILE).exists() for job in jobs)


# ---------------------------------------------------------------- output folders and disks


@pytest.mark.parametrize(
    "make,folder,says",
    [
        (lambda root: (root / "afile").write_text("x"), "afile", "is a file, not a folder"),
        (lambda root: (root / "afile").write_text("x"), "afile/run", "cannot be made (" ),
        (lambda root: None, "/proc/hostbound-run", "cannot be made or written in /proc"),
        (lambda root: None, "", "must name a folder"),
        (lambda root: ((root / "used").mkdir(), (root / "used" / "summary.json").write_text("{}")), "used", "already holds files"),
    ],
    ids=["a file", "under a file", "under /proc", "empty", "an earlier run's folder"],
)
def test_output_folders_that_cannot_be_used_are_refused_before_anything_is_written(make, folder, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make(tmp_path)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    for mode in ([], ["-m", "strategy=eager,async"]):
        key = "hydra.sweep.dir" if mode else "hydra.run.dir"
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
            preflight([*mode, f"{key}={folder}" if folder else f"{key}=''"])
        assert exc.value.code == EXIT_BAD_INPUT
        lines = err.getvalue().strip().splitlines()
        assert len(lines) == 1 and key in lines[0] and says in lines[0], lines
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing made, nothing removed


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders; the probe would rightly pass")
def test_a_read_only_folder_is_refused(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        preflight([f"hydra.run.dir={locked / 'run'}"])
    assert "Permission denied" in err.getvalue()


@pytest.mark.slow
def test_a_launch_folder_with_url_characters_keeps_its_store_in_place(tmp_path):
    launch = tmp_path / "team #1? 50%20 off"
    launch.mkdir()
    proc = run_cli("workload.steps=2", "output.timeline_steps=0", cwd=launch)
    assert proc.returncode == 0, proc.stderr[-2000:]
    db = launch / "outputs" / "mlflow.db"
    with sqlite3.connect(db) as con:
        assert con.execute("select count(*) from runs").fetchone()[0] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [launch.name]  # nothing landed beside it
    assert list((launch / "outputs" / "mlartifacts").rglob("summary.json"))


@pytest.mark.slow
def test_a_full_disk_leaves_complete_files_or_none(tmp_path):
    """A file-size limit of 200 kB (as a full disk would): trace.json (1.2 MB) cannot be written. The run
    says so in one line with status 4; the file before it is whole, no partial or temporary file stays,
    and there is no summary.json (written last: a folder holding one is a finished run)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    run_dir = tmp_path / "run"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    proc = subprocess.run([sys.executable, "-m", "harness", "tracking.enabled=false", f"hydra.run.dir={run_dir}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert proc.returncode == EXIT_WRITE_FAILED, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hostbound: error:")]
    assert errors == [f"hostbound: error: cannot write {run_dir / 'trace.json'}: File too large"]
    assert not (run_dir / "trace.json").exists()
    assert not [p for p in run_dir.iterdir() if ".tmp" in p.name]
    assert not (run_dir / "summary.json").exists()
    assert len(pd.read_parquet(run_dir / "steps.parquet")) == compose_run().workload.steps


def test_a_write_killed_midway_leaves_the_previous_file(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text('{"old": true}\n')
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from harness.base.files import atomic_write\n"
        "def half(tmp):\n"
        "    with open(tmp, 'w') as f:\n"
        "        f.write('{\"new\": ')\n"
        "        f.flush()\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        f"atomic_write(Path({str(target)!r}), half)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert json.loads(target.read_text()) == {"old": True}


def test_a_failed_write_removes_its_temporary_file(tmp_path):
    def broken(tmp):
        Path(tmp).write_text("part")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="cannot write .*x.csv: No space left on device"):
        atomic_write(tmp_path / "x.csv", broken)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- docs/reliability.md

DOC = Path(__file__).resolve().parent.parent / "docs" / "reliability.md"
BEGIN, END = "<!-- limits: begin (python tests/test_reliability.py rewrites) -->", "<!-- limits: end -->"


def limits_table() -> str:
    """Every range the harness checks, from the one table it checks them with."""
    from harness.config.limits import _number_text

    def row(key: str, limit: Limit) -> str:
        return f"| `{key}` | {_number_text(limit.low)} | {_number_text(limit.high)} | {limit.unit} |"

    config = [row(k, v) for k, v in LIMITS.items() if not k.startswith("card.")]
    cards = [row(f"card: {k.removeprefix('card.')}", v) for k, v in LIMITS.items() if k.startswith("card.")]
    columns = [row(f"CSV column: {k}", v) for k, v in sorted(COLUMN_LIMITS.items())]
    return "\n".join(["| key | min | max | unit |", "|---|---|---|---|", *config, *cards, *columns])


def test_docs_list_every_limit():
    text = DOC.read_text()
    assert BEGIN in text and END in text
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == limits_table(), "docs/reliability.md's limits table is stale: run python tests/test_reliability.py"


if __name__ == "__main__":  # rewrite the table in docs/reliability.md
    head, rest = DOC.read_text().split(BEGIN, 1)
    DOC.write_text(f"{head}{BEGIN}\n{limits_table()}\n{END}{rest.split(END, 1)[1]}")
    print(f"rewrote the limits table in {DOC}")


@pytest.mark.parametrize("uri,status,says", [
    ("http://alice:s3cret@127.0.0.1:{port}", EXIT_BAD_INPUT, "holds a user name and password"),
    ("http://127.0.0.1:{port}", EXIT_TRACKING_FAILED, "Connection refused"),
    ("foo://bar", EXIT_BAD_INPUT, "unknown scheme 'foo'"),
], ids=["password", "down", "scheme"])
def test_the_report_reading_a_store_says_what_is_wrong_in_one_line_and_keeps_the_password_out(uri, status, says, tmp_path):
    """`python -m harness.report --tracking-uri` printed MLflow's traceback, the password in it."""
    proc = subprocess.run([sys.executable, "-m", "harness.report", "--tracking-uri", uri.format(port=free_port()), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "MLFLOW_HTTP_REQUEST_TIMEOUT": "2"})
    assert proc.returncode == status, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "s3cret" not in proc.stderr + proc.stdout
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
