"""Trace workloads: op lists from CSV, the export round trip, and clear errors for bad files."""
from __future__ import annotations

import json

import numpy as np

import pytest

from conftest import compose_run, run_cli
from harness.model.device import device_times
from harness.base.errors import ConfigError
from harness.sim.task_graph import LANE_HOST
from harness.sim.outcome import WALL_CLOCK_KEYS
from harness.sim.simulate import simulate_run
from harness.model.ops_csv import write_ops_csv
from harness.model.workload import build_workload, run_build_options

# A trace knows no memory plan or layout, and holds its MoE exchange as ops: the card's note on it is not said.
DIFFERENT_BY_NATURE = WALL_CLOCK_KEYS | {"peak_mem_gb", "devices", "tp", "moe_note"}


@pytest.mark.parametrize("preset,strategy", [("qwen3_30b_decode", "pipeline"), ("llama2_7b_prefill", "eager"), ("deepseek_v3", "async")])
def test_exported_op_list_reproduces_the_run(tmp_path, preset, strategy):
    run = compose_run(f"workload={preset}", f"strategy={strategy}", "workload.steps=3")
    wl = build_workload(run.workload, devices_per_node=run.hardware.link.devices_per_node, **run_build_options(run))
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
        ("name,kind,comm,ranks,bytes\na,comm,all_reduce,0,100\n", ["line 2", "'ranks'", "1..4096"]),
        ("name,kind,stream\na,cube,16\n", ["line 2", "'stream'", "0..15"]),
        ("name,kind,group\na,cube,1\nb,cube,1\n", ["line 2", "'group'"]),
        ("name,kind,group\na,cube,0\nb,cube,0\nc,cube,1\n", ["line 4", "'group'"]),
        ("name,kind,group\na,cube,\nb,cube,0\n", ["line 3", "'group'"]),
        ("name,kind,not_before_us\na,cube,-1\n", ["line 2", "'not_before_us'", "0..1e9"]),
        ("name,kind,launch_us\na,cube,abc\n", ["line 2", "'launch_us'", "not a number"]),
    ],
)
def test_bad_files_name_row_and_column(tmp_path, content, fragments):
    path = tmp_path / "ops.csv"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        build_workload(compose_run("workload=trace", f"workload.path={path}").workload)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_the_export_prints_the_command_that_reproduces_the_run(tmp_path):
    """A prefill at TP 4, batch 8: read back as `workload=trace` alone it ran as a decode at batch 1 (10 tok/s
    where the run gave 82,523, no TTFT, tp 1). The command the export prints carries what the CSV does not
    hold; run as printed, its summary is the original's but for what names the workload."""
    import shlex
    import subprocess
    import sys

    args = ["workload=qwen3_30b_prefill", "workload.steps=2", "strategy=async"]
    proc = subprocess.run([sys.executable, "-m", "harness.export_ops", *args, "--out", "p.csv"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    command = shlex.split(proc.stderr.strip().splitlines()[-1].removeprefix("read it back: "))
    assert command[:5] == ["python", "-m", "harness", "workload=trace", "workload.path=p.csv"] and "strategy=async" in command
    for name, overrides in (("original", args), ("replayed", command[3:])):
        ran = run_cli(*overrides, "tracking.enabled=false", f"hydra.run.dir={name}", cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
    original, replayed = (json.loads((tmp_path / name / "summary.json").read_text()) for name in ("original", "replayed"))
    naming = WALL_CLOCK_KEYS | {"peak_mem_gb", "workload", "overrides", "config_hash", "setting_hash", "moe_note"}
    assert {k: v for k, v in original.items() if k not in naming} == {k: v for k, v in replayed.items() if k not in naming}
    assert original["ttft_ms"] > 0 and original["tp"] == 4 and original["batch_size"] == 8


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
    # the experts a step hits (fewer than a rank holds) come back, and with them what the expert matmuls allocate
    assert np.array_equal(back.step_weight_bytes, wl.step_weight_bytes)
    assert np.array_equal(back.activation_bytes(), wl.activation_bytes())
    # and the experts each grouped matmul multiplies, which the Atlas A2 prices per group
    assert wl.expert_groups is not None and np.array_equal(back.expert_groups, wl.expert_groups)
    routed = np.array(["grouped" in n for n in wl.op_names])
    assert routed.any() and (wl.step_weight_bytes[:, routed] < wl.weight_bytes[routed]).all()


def test_where_a_collectives_ranks_sit_survives_the_round_trip(tmp_path):
    """Qwen3-30B-A3B at TP 4, DP 4 without EP on the Atlas A2: the DP gathers' groups are every 4th of 16
    devices (two nodes); written out and read back they are priced the same (the rank_stride and devices
    columns), where a list without those columns takes its groups as consecutive (one node)."""
    run = compose_run("hardware=atlas_a2", "workload=qwen3_30b_decode", "workload.tp=4", "workload.dp=4", "workload.ep=1", "workload.steps=1")
    wl = build_workload(run.workload)
    path = tmp_path / "ops.csv"
    write_ops_csv(wl, path)
    back = build_workload(compose_run("hardware=atlas_a2", "workload=trace", f"workload.path={path}").workload)
    assert back.devices == wl.devices == 16 and np.array_equal(back.comm_stride, wl.comm_stride)
    assert np.array_equal(device_times(back, run.hardware)[0], device_times(wl, run.hardware)[0])
    dispatch = wl.op_names.index("layers.0.moe_dispatch")
    assert wl.comm_stride[dispatch] == 4
    bare = tmp_path / "bare.csv"
    import pandas as pd

    pd.read_csv(path, keep_default_na=False, dtype=str).drop(columns=["rank_stride", "devices"]).to_csv(bare, index=False)
    consecutive = build_workload(compose_run("hardware=atlas_a2", "workload=trace", f"workload.path={bare}").workload)
    assert device_times(consecutive, run.hardware)[0][0, dispatch] < device_times(wl, run.hardware)[0][0, dispatch]


@pytest.mark.parametrize(
    "rows, message",
    [
        ("ar,comm,10,all_reduce,8,1,8\nag,comm,10,all_gather,8,1,16\n",
         "line 3 column 'devices': '16' differs from the 8 of the rows before it: one deployment a file"),
        ("ar,comm,10,all_reduce,8,1,4\nag,comm,10,all_gather,8,1,4\n",
         "line 2 column 'devices': '4' cannot hold whole groups of 8 ranks 1 apart (8 devices a group)"),
        ("ar,comm,10,all_reduce,2,4,6\nag,comm,10,all_gather,2,4,6\n",
         "line 2 column 'devices': '6' cannot hold whole groups of 2 ranks 4 apart (8 devices a group)"),
        ("ar,comm,10,all_reduce,8,1,\nag,comm,10,all_gather,8,1,16\n", None),  # an empty cell says nothing
    ],
)
def test_a_deployment_its_groups_do_not_tile_is_refused(tmp_path, rows, message):
    """`devices` is the deployment's, one for the file, and its groups tile it whole: 4 devices hold no group
    of 8 (it was priced as crossing nodes, TP 8 over the network), 6 no pair 4 apart."""
    path = tmp_path / "ops.csv"
    path.write_text("name,kind,bytes,comm,ranks,rank_stride,devices\n" + rows)
    if message is None:
        assert build_workload(compose_run("workload=trace", f"workload.path={path}").workload).devices == 16
        return
    with pytest.raises(ConfigError) as refused:
        build_workload(compose_run("workload=trace", f"workload.path={path}").workload)
    assert str(refused.value) == f"workload.path={str(path)!r} {message}"


# ---------------------------------------------------------------- measured op lists (imported profiles)

STAGES = "framework_us,infer_shape_us,tiling_us,alloc_us,launch_us,free_us"


def measured_run(tmp_path, body: str, *overrides: str):
    path = tmp_path / "ops.csv"
    path.write_text(body)
    # No front-end gap between queued kernels: the hand computations below are about the file's own costs
    # (a replay command sets the gap its trace measured: harness.importers.fit.front_end_gaps_us).
    return simulate_run(compose_run("workload=trace", f"workload.path={path}", "hardware=h100", "hardware.device.kernel_gap_us=0", *overrides))


def test_measured_costs_syncs_and_a_graph_launch_group_by_hand(tmp_path):
    """a: 10 µs framework, 5 µs launch, 20 µs kernel. g: 3 + 7 µs, then its graph's two kernels (4 and
    6 µs, +1 µs device-side dispatch each) after a's. s: 1 µs of host work, then waits for h and
    returns 2 µs later. Host: a [0,15], g [15,25], s [25,26]; device: a [15,35], g [35,40], h [40,47];
    the sync ends at 49 µs. The device works 20 + 4 + 6 µs of it: a graph node's dispatch is idle."""
    outcome = measured_run(
        tmp_path,
        f"step,name,kind,stream,device_us,after,group,in_graph,{STAGES},host_us\n"
        "0,a,vector,0,20,-,,0,10,0,0,0,5,0,\n"
        "0,g,cube,0,4,0,1,1,3,0,0,0,7,0,\n"
        "0,h,cube,0,6,1,1,1,0,0,0,0,0,0,\n"
        "0,s,sync,,,2,,0,1,0,0,0,0,0,2\n",
        "hardware.graph.task_dispatch_us=1",
    )
    summary = outcome.summary
    assert summary["step_ms_mean"] * 1e3 == pytest.approx(49.0)
    assert summary["launches_per_step"] == 2 and summary["ops_per_step"] == 3
    assert summary["device_busy"] == pytest.approx(30.0 / 49.0)
    assert summary["breakdown_sync"] == pytest.approx(2.0 / 49.0)


def test_carried_in_work_and_a_wait_for_unseen_work_by_hand(tmp_path):
    """c was launched before the step: it runs at once [0,5]. k is launched at 3 µs but its stream is
    busy with work the file does not hold until 10 µs: [10,13]."""
    outcome = measured_run(
        tmp_path,
        f"step,name,kind,stream,device_us,after,carried_in,not_before_us,{STAGES}\n"
        "0,c,vector,0,5,-,1,,0,0,0,0,0,0\n"
        "0,k,vector,0,3,0,0,10,2,0,0,0,1,0\n",
    )
    summary = outcome.summary
    assert summary["step_ms_mean"] * 1e3 == pytest.approx(13.0)
    assert summary["device_busy"] == pytest.approx(8.0 / 13.0)
    assert summary["breakdown_external"] > 0 and summary["launches_per_step"] == 1
    assert "device.unseen" in outcome.result.graph.lane_names


def test_a_wait_for_unseen_work_holds_only_in_the_steps_that_had_it(tmp_path):
    """k (3 µs, no host cost) waits for unseen work until 10 µs in step 0; in step 1 nothing held its
    stream: it starts at once."""
    outcome = measured_run(
        tmp_path,
        f"step,name,kind,stream,device_us,after,carried_in,not_before_us,{STAGES}\n"
        "0,k,vector,0,3,-,0,10,0,0,0,0,0,0\n"
        "1,k,vector,0,3,-,0,,0,0,0,0,0,0\n",
    )
    assert (outcome.steps["latency_ms"] * 1e3).tolist() == pytest.approx([13.0, 3.0])


def test_a_syncs_host_time_runs_on_the_main_thread_before_it_waits(tmp_path):
    """a: framework [0,10], launch [10,15], kernel [15,17]. s: its framework time [15,21] on the main
    thread, then its own 2 µs once the kernel is done (it is): [21,23]."""
    outcome = measured_run(
        tmp_path,
        f"name,kind,stream,device_us,after,{STAGES},host_us\n"
        "a,vector,0,2,-,10,0,0,0,5,0,\n"
        "s,sync,,,0,6,0,0,0,0,0,2\n",
    )
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(23.0)


def test_host_jitter_reaches_the_host_ops_and_syncs_of_a_trace(tmp_path):
    """A kernel, a front-end op and a sync, each with host time: with host jitter on, every task on a
    host thread (the sync's framework time and its own time included) draws a multiplier."""
    body = (
        f"name,kind,stream,device_us,after,{STAGES},host_us\n"
        "a,vector,0,20,-,10,0,0,0,5,0,\n"
        "h,host,,,0,0,0,0,0,0,0,4\n"
        "s,sync,,,0,6,0,0,0,0,0,2\n"
    )
    plain, jittered = (measured_run(tmp_path, body, "workload.steps=3", f"hardware.host.jitter_cv={cv}").result for cv in (0, 0.3))
    graph = plain.graph
    d_plain, d_jittered = plain.end_us - plain.start_us, jittered.end_us - jittered.start_us
    on_host = (graph.lane_kinds[graph.tasks["lane"]] == LANE_HOST) & (d_plain > 0)
    assert on_host.sum() >= 3 * 5  # a's framework and launch, h, s's framework and its own time, in each step
    assert np.all(np.abs(d_jittered[on_host] / d_plain[on_host] - 1) > 1e-9)


@pytest.mark.parametrize("second_stream,step_us", [(2, 14.0), (0, 22.0)])
def test_more_streams_run_side_by_side(tmp_path, second_stream, step_us):
    outcome = measured_run(
        tmp_path,
        f"name,kind,stream,device_us,after,{STAGES}\n"
        "a,cube,0,10,-,1,0,0,0,1,0\n"
        f"b,cube,{second_stream},10,-,1,0,0,0,1,0\n",
        "workload.steps=2",
    )
    assert outcome.summary["step_ms_mean"] * 1e3 == pytest.approx(step_us)
    assert ("device.stream2" in outcome.result.graph.lane_names) == (second_stream == 2)


def test_repeat_plays_the_files_steps_again(tmp_path):
    body = f"step,name,kind,device_us,{STAGES}\n0,a,cube,5,1,0,0,0,1,0\n1,a,cube,9,1,0,0,0,1,0\n"
    once = measured_run(tmp_path, body)
    thrice = measured_run(tmp_path, body, "workload.repeat=3")
    assert once.workload.steps == 2 and thrice.workload.steps == 6
    assert np.allclose(thrice.steps["latency_ms"], np.tile(once.steps["latency_ms"], 3))


def test_a_graph_over_measured_steps_says_it_dropped_their_syncs(tmp_path):
    outcome = measured_run(
        tmp_path,
        f"step,name,kind,stream,device_us,after,{STAGES},host_us\n"
        "0,a,vector,0,20,-,10,0,0,0,5,0,\n"
        "0,s,sync,,,0,1,0,0,0,0,0,2\n",
        "strategy=cuda_graph", "workload.repeat=2", "workload.warmup_steps=1",
        "hardware.graph.replay_launch_us=15", "hardware.graph.task_dispatch_us=1",
    )
    summary = outcome.summary
    assert summary["graph_syncs_dropped"] == 1 and "dropped" in summary["graph_note"]
    # The replayed step: one 15 µs trigger, then the kernel with its device-side dispatch; no host work.
    assert summary["steps_measured"] == 1 and summary["step_ms_mean"] * 1e3 == pytest.approx(15 + 20 + 1)


def test_a_prefill_traces_batch_column_sets_its_prompt_tokens_without_a_tokens_column(tmp_path):
    """Steps of 2 and 3 prompts of 512 tokens: 2,560 prompt tokens. Without a tokens column each step was
    counted at batch_size 7 x 512 = 3,584 (throughput 2.8x too high); with one, right all along."""
    rows = "step,name,kind,device_us,batch\n0,a,vector,100,2\n1,a,vector,100,3\n"
    runs = {}
    for name, text in (("batch", rows), ("tokens", rows.replace("batch\n", "batch,tokens\n").replace(",2\n", ",2,1024\n").replace(",3\n", ",3,1536\n"))):
        path = tmp_path / f"{name}.csv"
        path.write_text(text)
        outcome = simulate_run(compose_run("workload=trace", f"workload.path={path}", "workload.phase=prefill", "workload.context_len=512",
                                           "workload.batch_size=7", "workload.warmup_steps=0", "hardware.host.jitter_cv=0"))
        assert outcome.workload.tokens.tolist() == [1024, 1536]
        runs[name] = outcome.summary["throughput_tok_s"]
    assert runs["batch"] == runs["tokens"]


def test_an_op_list_written_out_says_its_throughput_counts_batch_size_tokens():
    """Two ops a step gave 8,130 tok/s with no word that the tokens are batch_size's, as a profile's say."""
    ops = simulate_run(compose_run("workload.card=null", "workload.ops=[{name:a,device_us:2},{name:b,device_us:10}]", "workload.steps=2"))
    assert ops.summary["throughput_note"].startswith("tokens per step = workload.batch_size (1): an op list")
    assert "throughput_note" not in simulate_run(compose_run("workload.steps=2")).summary


def test_a_trace_whose_step_column_sets_the_steps_says_workload_steps_did_not(tmp_path):
    """workload.steps=3 on a 4-step CSV ran 4 steps while the header and summary said steps=3 (documented in
    outputs.md, unsaid where the figures are). Not written on the command line, nothing to say."""
    path = tmp_path / "four.csv"
    path.write_text("step,name,kind,device_us\n" + "".join(f"{s},a,vector,100\n" for s in range(4)))
    for written, run_dir in ((("workload.steps=3",), "set"), ((), "unset")):
        done = run_cli("workload=trace", f"workload.path={path}", *written, "tracking.enabled=false", f"hydra.run.dir={run_dir}", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        summary = json.loads((tmp_path / run_dir / "summary.json").read_text())
        assert summary["steps_measured"] == 4
        said = "4 steps ran, not workload.steps=3: the trace's step column sets them"
        assert (said in summary.get("steps_note", "")) == bool(written) and (said in done.stdout) == bool(written)
    # A CSV without a step column runs workload.steps, repeat times: nothing to say (it blamed a step column).
    flat = tmp_path / "flat.csv"
    flat.write_text("name,kind,device_us\na,vector,100\n")
    done = run_cli("workload=trace", f"workload.path={flat}", "workload.steps=4", "workload.repeat=2", "tracking.enabled=false",
                   "hydra.run.dir=flat", cwd=tmp_path)
    summary = json.loads((tmp_path / "flat" / "summary.json").read_text())
    assert done.returncode == 0 and summary["steps_measured"] == 8 and "step column" not in summary.get("steps_note", "")
