"""Trace workloads: op lists from CSV, the export round trip, and clear errors for bad files."""
from __future__ import annotations

import json

import numpy as np

import pytest

from conftest import compose_run, run_cli
from harness.device import device_times
from harness.errors import ConfigError
from harness.run import simulate_run
from harness.trace_io import write_ops_csv
from harness.workload import build_workload

DIFFERENT_BY_NATURE = {"sim_wall_s", "peak_mem_gb", "devices"}  # a trace knows no memory plan or layout


@pytest.mark.parametrize("preset,strategy", [("qwen3_30b_decode", "pipeline"), ("llama2_7b_prefill", "eager"), ("deepseek_v3", "async")])
def test_exported_op_list_reproduces_the_run(tmp_path, preset, strategy):
    run = compose_run(f"workload={preset}", f"strategy={strategy}", "workload.steps=3")
    wl = build_workload(run.workload, devices_per_node=run.hardware.link.devices_per_node)
    path = tmp_path / "ops.csv"
    write_ops_csv(wl, path, device_times(wl, run.hardware)[0])
    phase = run.workload.phase.value
    again = compose_run("workload=trace", f"workload.path={path}", f"strategy={strategy}", f"workload.phase={phase}")
    original, replayed = simulate_run(run), simulate_run(again)
    keys = set(original.summary) - DIFFERENT_BY_NATURE
    assert {k: original.summary[k] for k in keys} == {k: replayed.summary[k] for k in keys}
    assert original.steps.equals(replayed.steps)


def test_cost_model_prices_a_trace_without_device_times(tmp_path):
    run = compose_run("workload=qwen25_7b_decode", "workload.steps=2")
    wl = build_workload(run.workload)
    path = tmp_path / "ops.csv"
    write_ops_csv(wl, path)  # flops and bytes only
    replayed = simulate_run(compose_run("workload=trace", f"workload.path={path}"))
    assert replayed.summary["step_ms_mean"] == pytest.approx(simulate_run(run).summary["step_ms_mean"])


def test_minimal_csv_runs(tmp_path):
    path = tmp_path / "ops.csv"
    path.write_text("name,kind,device_us\nmatmul,cube,20\nadd,vector,3\nreduce,comm,8\n")
    outcome = simulate_run(compose_run("workload=trace", f"workload.path={path}", "workload.steps=5"))
    assert outcome.summary["ops_per_step"] == 3 and outcome.workload.steps == 5
    graph = outcome.result.graph
    comm_lane = graph.lane_names.index("device.comm")
    assert (graph.tasks["lane"] == comm_lane).sum() == 5  # the comm op on the communication stream


@pytest.mark.parametrize(
    "content,fragments",
    [
        ("kind,device_us\ncube,1\n", ["missing column 'name'"]),
        ("name,kind,flops\na,cube,1e9\nb,vector,lots\n", ["line 3", "'flops'", "'lots'"]),
        ("name,kind\na,cube\nb,tensor\n", ["line 3", "'kind'", "'tensor'"]),
        ("name,kind,device_us\na,cube,-4\n", ["line 2", "'device_us'", "'-4'"]),
        ("name,kind,after\na,cube,\nb,cube,5\n", ["line 3", "'after'", "'5'"]),
        ("name,kind,color\na,cube,red\n", ["unknown column", "color"]),
        ("name,kind\n", ["no rows"]),
        ("step,name,kind\n0,a,cube\n,b,cube\n", ["line 3", "'step'", "empty"]),
        ("step,name,kind\n1e12,a,cube\n", ["line 2", "'step'"]),
        ("step,name,kind\n0.5,a,cube\n", ["line 2", "whole number"]),
        ("name,kind,flops\na,cube,inf\n", ["line 2", "'flops'", "finite"]),
        ("name,kind,comm,ranks,bytes\na,comm,all_reduce,0,100\n", ["line 2", "'ranks'", ">= 1"]),
        ("name,kind,stream\na,cube,16\n", ["line 2", "'stream'", "0..15"]),
    ],
)
def test_bad_files_name_row_and_column(tmp_path, content, fragments):
    path = tmp_path / "ops.csv"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        build_workload(compose_run("workload=trace", f"workload.path={path}").workload)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_export_command_and_bad_trace_on_the_command_line(tmp_path):
    out = tmp_path / "ops.csv"
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "harness.export_ops", "workload=qwen25_7b_decode", "workload.steps=2", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().startswith("step,name,kind")
    run_dir = tmp_path / "run"
    proc = run_cli("workload=trace", f"workload.path={out}", "tracking.enabled=false", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run_dir / "summary.json").read_text())["ops_per_step"] == 284
    out.write_text("name,kind\na,cube\nb,quantum\n")
    proc = run_cli("workload=trace", f"workload.path={out}", "tracking.enabled=false", cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "line 3" in proc.stderr


def test_ops_without_dependencies_and_routed_flags_survive_the_round_trip(tmp_path):
    run = compose_run("workload=deepseek_v3", "workload.quant=bf16", "workload.steps=2", "hardware.device.hbm_gb=128")
    wl = build_workload(run.workload)
    path = tmp_path / "ops.csv"
    write_ops_csv(wl, path)
    back = build_workload(compose_run("workload=trace", f"workload.path={path}").workload)
    assert back.after == wl.after
    assert np.array_equal(back.flags, wl.flags) and np.array_equal(back.weight_bytes, wl.weight_bytes)
