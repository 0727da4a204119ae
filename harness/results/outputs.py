"""Files of a run directory: summary.json, steps.parquet, trace.json, and the terminal summary.

Every file is written through harness.base.files.atomic_write: complete or not at all.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.base.files import atomic_write, write_json, write_text
from harness.sim.outcome import ALL_BUILDS_NOTE, shown_steps
from harness.sim.task_graph import CATEGORIES, LANE_COPY, LANE_DEVICE, LANE_EXTERNAL
from harness.base.overrides import split_override

if TYPE_CHECKING:
    from harness.results.drawer import BackgroundDrawer
    from harness.sim.outcome import RunResult

SUMMARY_FILE = "summary.json"
# The launch folder's MLflow artifact store (outputs/mlartifacts): copies of run folders' files, not runs.
ARTIFACTS_FOLDER = "mlartifacts"
STEPS_FILE = "steps.parquet"
TRACE_FILE = "trace.json"
TIMELINE_FILE = "timeline.png"
# trace.json's cap: ~100 bytes an event, so ~50 MB (Perfetto's UI loads that; gigabytes it does not).
MAX_TRACE_EVENTS = 500_000
# Override keys that only say where files and runs go, never what ran: no view compares runs by them.
WHERE_THINGS_GO = ("tracking.", "output.", "hydra", "resume")

# A sweep's folder: its comparison of the jobs, and the mark a job that failed leaves in its own folder.
RESULTS_CSV = "results.csv"
RESULTS_MD = "results.md"
# A request's latencies, where a run has them: a prefill's first token (`ttft_ms`), a serving run's
# median first token and time per output token (vLLM's names). A comparison shows them after the step
# time when some run of its table has them, and MLflow's runs table shows the same three (here, not in
# comparison.py: the store's logging process imports no pandas).
LATENCY_SHOWN = ["ttft_ms", "median_ttft_ms", "median_tpot_ms"]
JOB_FAILED_FILE = "JOB_FAILED.txt"  # in a job's folder: the one line that stopped it


def failed_job_dirs(sweep_dir: Path) -> list[Path]:
    """The folders of the jobs that failed (their JOB_FAILED.txt, at any depth: hydra.sweep.subdir may
    nest), absolute."""
    return sorted(p.parent.absolute() for p in sweep_dir.rglob(JOB_FAILED_FILE))

log = logging.getLogger(__name__)


def write_outputs(
    run_dir: Path, outcome: "RunResult", names: dict, trace_steps: int, timeline_steps: int = 0, drawer: "BackgroundDrawer | None" = None
) -> None:
    """summary.json last: a folder holding it is a finished run (reports, results.csv and resume=true
    rely on that); a run stopped while writing leaves the files before, complete, and no summary.
    `drawer`: a process started before the simulation draws timeline.png while the other files are
    written (harness.results.drawer.BackgroundDrawer); without it, it is drawn here."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if timeline_steps > 0:
        if drawer is None:
            from harness.results.timeline import draw_timeline  # matplotlib only when a picture is asked for

            draw_timeline(outcome, run_dir / TIMELINE_FILE, timeline_steps)
        else:
            drawer.draw(outcome, run_dir / TIMELINE_FILE, timeline_steps)
    write_steps(run_dir / STEPS_FILE, outcome.step_columns)
    if trace_steps > 0:
        write_text(run_dir / TRACE_FILE, chrome_trace_text(outcome, trace_steps))
    if drawer is not None:
        drawer.wait()
    write_json(run_dir / SUMMARY_FILE, {**names, **outcome.summary})


def write_steps(path: Path, columns: dict[str, np.ndarray]) -> None:
    """steps.parquet from the steps table's columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_arrays([_arrow_column(values) for values in columns.values()], names=list(columns))
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def _arrow_column(values: np.ndarray):
    """A numpy column as an Arrow array, built from its buffers: pyarrow's own conversion (`pa.array`)
    imports pandas first, a quarter of a default run's start-up, for a table of a few columns."""
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    n = len(values)
    if values.dtype == bool:
        return pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(np.packbits(values, bitorder="little"))])
    if values.dtype.kind in "iuf":
        return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), n, [None, pa.py_buffer(values)])
    encoded = [str(value).encode() for value in values]  # text (the steps' mode)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def read_steps(path: Path) -> dict[str, np.ndarray]:
    """The columns write_steps wrote."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return {name: table.column(name).to_numpy() for name in table.column_names}


def chrome_trace(outcome: "RunResult", trace_steps: int) -> dict:
    """Chrome trace-event JSON (opens in Perfetto) of the first `trace_steps` measured steps."""
    return json.loads(chrome_trace_text(outcome, trace_steps))


def chrome_trace_text(outcome: "RunResult", trace_steps: int) -> str:
    """chrome_trace as the text trace.json holds. The task events are formatted straight into JSON: as
    dicts passed to json.dumps they cost ~45 ms for a 2-step Llama-2 trace, the largest file cost of a
    sweep's job; names are escaped by json.dumps, numbers are ints and finite floats (repr, as json writes)."""
    result = outcome.result
    graph = result.graph
    tasks = graph.tasks
    shown = shown_steps(outcome.step_columns["measured"], trace_steps)
    step = result.column("step")
    # A zero-length task of no op is a marker of the step's structure (its start, a serving step's
    # opening), not work: a viewer would list it as an event of the lane it sits on.
    marker = (tasks["op"] < 0) & (result.end_us <= result.start_us)
    chosen = np.flatnonzero(np.isin(step, shown) & ~marker)
    if chosen.size > MAX_TRACE_EVENTS:  # a million-op step would write gigabytes no viewer opens
        log.warning(
            "trace.json holds the first %d of the %d tasks of steps %d-%d (at most %d events)",
            MAX_TRACE_EVENTS, chosen.size, shown[0], shown[-1], MAX_TRACE_EVENTS,
        )
        chosen = chosen[:MAX_TRACE_EVENTS]
    pid_of_kind = {0: 1, LANE_DEVICE: 2, LANE_COPY: 3, LANE_EXTERNAL: 2}  # external waits show with the device
    meta: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "host"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "device"}},
        {"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "copy engines"}},
    ]
    for lane, name in enumerate(graph.lane_names):
        meta.append({"ph": "M", "name": "thread_name", "pid": pid_of_kind[int(graph.lane_kinds[lane])], "tid": lane, "args": {"name": name}})
    op_names = graph.op_names
    # Plain lists: reading numpy records one by one costs more than building the events.
    ops, categories, lanes, steps = (tasks[field][chosen].tolist() for field in ("op", "category", "lane", "step"))
    # Times to the nanosecond: the viewer's resolution, and short numbers write several times faster.
    # Ends are rounded like starts and durations taken between the rounded times: rounding a duration
    # on its own can push an event 1 ns into the next one on its lane.
    # From the work's start, as a profiler shows a kernel: the device front end's lead is idle.
    starts_rounded = np.round(result.work_start_us[chosen], 3)
    starts = starts_rounded.tolist()
    durations = np.round(np.round(result.end_us[chosen], 3) - starts_rounded, 3).tolist()
    deciders = result.decider[chosen].tolist()
    pid_of_lane = [pid_of_kind[int(kind)] for kind in graph.lane_kinds]
    heads: dict[tuple[int, int], str] = {}  # (op, category) → the event's fixed start, escaped once
    parts = [json.dumps(event) for event in meta]
    for i, op, code, lane, step_, start, duration, decider in zip(chosen.tolist(), ops, categories, lanes, steps, starts, durations, deciders):
        head = heads.get((op, code))
        if head is None:
            category = CATEGORIES[code]
            label = op_names[op] if op >= 0 else "step"
            name = f"{label} {category}" if category != "compute" else label
            head = heads[(op, code)] = f'{{"ph": "X", "name": {json.dumps(name)}, "cat": {json.dumps(category)}, '
        parts.append(
            f'{head}"pid": {pid_of_lane[lane]}, "tid": {lane}, "ts": {start!r}, "dur": {duration!r}, '
            f'"args": {{"task": {i}, "step": {step_}, "decided_by": {decider}}}}}'
        )
    step_end = outcome.step_columns["end_ms"] * 1e3  # the result may hold only the traced steps
    for s in shown.tolist():
        parts.append(json.dumps({"ph": "i", "s": "g", "name": f"step {s} end", "pid": 1, "tid": 0, "ts": float(step_end[s])}))
    return '{"traceEvents": [' + ", ".join(parts) + '], "displayTimeUnit": "ms"}\n'


def _present(value: Any) -> bool:
    """A summary value that is there: not missing, not NaN (a table row holds NaN for keys other runs have)."""
    return value is not None and not (isinstance(value, float) and value != value)


def run_notes(summary: Any) -> str:
    """What a table row needs said next to its numbers (results.md, reports, MLflow's `notes` tag):
    graphs built and their padding, a graph that did not apply and why, tiling hit rate, and the
    notes that qualify a figure (few finished requests, tokens per step of a profile)."""
    get = summary.get
    notes = []
    captures = get("graph_captures")
    if _present(captures) and captures > 0:
        notes.append(f"{int(captures)} capture{'s' if captures != 1 else ''}")
        if _present(get("padding_waste")) and get("padding_waste") >= 0.005:
            notes.append(f"padding waste {get('padding_waste'):.2f}")
    for key in ("graph_note", "engine_note", "serving_note", "ttft_note", "steps_note", "throughput_note", "tiling_note"):
        if _present(get(key)) and get(key):
            notes.append(str(get(key)))
    if _present(get("tiling_cache_hit_rate")):
        notes.append(f"tiling hit rate {get('tiling_cache_hit_rate'):.2f}")
    return "; ".join(notes)


def _front_end_part(summary: dict) -> str:
    """How much of the bubble is the device front end's gaps (shown where there is a tenth of a point)."""
    front_end = summary.get("bubble_front_end", 0.0)
    return f" (front-end gaps {front_end:.1%})" if front_end >= 0.0005 else ""


def short_setting(key: str, value: str) -> str:
    """A value set on the command line by its key's last part (`batch_size=8`), as names and headers show it;
    a switch that a last part cannot name by its own (`workload.serving.enabled`) by what it turns on."""
    if key.removeprefix("+") in ("workload.serving.enabled", "serving.enabled"):
        from omegaconf import BooleanNode  # the reading the config took: on, yes, 1 are true too

        try:
            enabled = bool(BooleanNode(value=value)._value())
        except Exception:  # not a boolean: the run refused it
            return f"serving.enabled={value}"
        return "serving" if enabled else "no serving"
    return f"{key.rsplit('.', 1)[-1]}={value}"


def values_set_on_top(overrides: str) -> str:
    """The values a command line set beyond the presets, by their keys' last part (`batch_size=8
    steps=4`; `experiment=…` too): two jobs of a sweep otherwise print the same header."""
    parts = []
    for override in overrides.split():
        key, _, value = split_override(override)
        if key and not key.startswith(WHERE_THINGS_GO) and key not in ("hardware", "workload", "strategy", "engine"):
            parts.append(short_setting(key, value))
    return " ".join(parts)


def format_summary(summary: dict, names: dict, run_dir: Path) -> str:
    """A few lines for the terminal: what ran, the headline numbers, where the files are."""
    breakdown = sorted(
        ((k.removeprefix("breakdown_"), v) for k, v in summary.items() if k.startswith("breakdown_") and v > 0.005),
        key=lambda kv: -kv[1],
    )
    on_top = values_set_on_top(str(summary.get("overrides", "")))
    lines = [
        f"hostbound: {names['workload']} on {names['hardware']} with {names['strategy']}"
        + (f", engine {names['engine']}" if names.get("engine", "none") != "none" else "")
        + (f" ({on_top})" if on_top else ""),
        f"  throughput   {summary['throughput_tok_s']:.1f} tok/s" + (f" ({summary['throughput_note']})" if "throughput_note" in summary else ""),
        f"  step         mean {summary['step_ms_mean']:.3f} ms, p50 {summary['step_ms_p50']:.3f} ms, p99 {summary['step_ms_p99']:.3f} ms",
    ]
    if "steps_note" in summary:
        lines.append(f"  note         {summary['steps_note']}")
    if "ttft_ms" in summary:
        lines.append(f"  TTFT         {summary['ttft_ms']:.3f} ms")
    lines += [
        f"  device busy  {summary['device_busy']:.1%}   bubble {summary['bubble_ratio']:.1%}{_front_end_part(summary)}"
        f"   host busy (max thread) {summary['host_busy_max']:.1%}",
        f"  bound        {summary['bound']}: {summary['bound_reason']}",
        "  critical path " + ", ".join(f"{k} {v:.1%}" for k, v in breakdown),
    ]
    if "graph_captures" in summary:
        graph = f"  graph        {summary['graph_captures']} built"
        if "capture_ms" in summary:
            included = ALL_BUILDS_NOTE in summary.get("steps_note", "")
            graph += f" in {summary['capture_ms']:.0f} ms ({'in the figures above: no step replays' if included else 'outside the steady state above'})"
        lines.append(graph + f", padding waste {summary.get('padding_waste', 0.0):.1%}")
    if "graph_note" in summary:
        lines.append(f"  note         {summary['graph_note']}")
    if "tiling_cache_hit_rate" in summary:
        lines.append(f"  tiling cache hit rate {summary['tiling_cache_hit_rate']:.1%}")
    if "tiling_note" in summary:
        lines.append(f"  note         {summary['tiling_note']}")
    if "moe_note" in summary:
        lines.append(f"  note         {summary['moe_note']}")
    if "requests_completed" in summary:
        serving = f"  serving      {summary['requests_completed']} requests done, batch mean {summary['batch_mean']:.1f}"
        if "request_latency_ms_p50" in summary:
            serving += f", latency p50 {summary['request_latency_ms_p50']:.0f} ms"
        if "median_tpot_ms" in summary:
            serving += f", TPOT p50 {summary['median_tpot_ms']:.1f} ms"
        lines.append(serving)
        for key in ("engine_note", "ttft_note", "serving_note"):
            if key in summary:
                lines.append(f"  note         {summary[key]}")
    lines += [
        f"  {summary['ops_per_step']} ops/step, {summary['launches_per_step']:.0f} launches/step, "
        f"{summary['tasks_simulated']} tasks in {summary['sim_wall_s']:.2f} s"
        + (f", of which {summary['compile_s']:.2f} s compiling kernels (first run only)" if summary.get("compile_s", 0) > 0 else ""),
        f"  outputs      {run_dir}",
    ]
    return "\n".join(lines)


def run_summaries(root: Path) -> list[Path]:
    """The summary.json of every run folder under `root`, in path order: not MLflow's copies of them under
    an artifact store (outputs/mlartifacts), which a report read as the same runs again and resume=true
    took for the finished run (logging it to MLflow a second time)."""
    root = Path(root)
    return [s for s in sorted(root.rglob(SUMMARY_FILE)) if ARTIFACTS_FOLDER not in s.relative_to(root).parts[:-1]]
