"""`python -m harness.export_ops`: where it writes, what it refuses, and whether the read-back command it
prints reproduces the run or says why not (harness/cli/export_ops.py)."""
from __future__ import annotations

import shlex

import pytest

from conftest import compose_run, run_cli
from harness.cli.export_ops import main as export_ops
from harness.sim.outcome import WALL_CLOCK_KEYS
from harness.sim.simulate import simulate_run

# Summary keys that name or echo what ran rather than measure it: a file read back is another workload
# (its name, its overrides, a card's echoed settings), with no memory plan.
NAMING = WALL_CLOCK_KEYS | {"workload", "overrides", "config_hash", "setting_hash", "peak_mem_gb", "moe_note", "quant", "kv_cache_dtype", "decode_kv_reads"}


def export(tmp_path, capsys, *overrides: str, out: str = "ops.csv") -> tuple[list[str], list[str]]:
    """Export in-process; (the read-back command's overrides, the stderr lines before it)."""
    export_ops([*overrides, "--out", str(tmp_path / out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("read it back: ")
    command = shlex.split(lines[-1].removeprefix("read it back: "))
    assert command[:3] == ["python", "-m", "harness"]
    return command[3:], lines[:-1]


def refused(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as stop:
        export_ops(list(args))
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def figures(overrides: list[str]) -> dict:
    summary = simulate_run(compose_run(*overrides, "tracking.enabled=false")).summary
    return {k: v for k, v in summary.items() if k not in NAMING}


def test_a_missing_parent_folder_is_made(tmp_path, capsys):
    """`--out nodir/o.csv` stopped with "[Errno None] cannot write …" and its reason twice; profile --out makes
    its folder, and so does this: the file written there is the one written into an existing folder."""
    export(tmp_path, capsys, "workload.steps=1", out="here.csv")
    export(tmp_path, capsys, "workload.steps=1", out="nodir/deeper/o.csv")
    assert (tmp_path / "nodir" / "deeper" / "o.csv").read_bytes() == (tmp_path / "here.csv").read_bytes()


def test_an_advise_key_gets_the_main_commands_line(tmp_path, capsys):
    """advise=NAME told the user to add +advise=NAME, which then failed as no such key: the line is now the
    one `python -m harness advise=NAME` gives, and nothing is written."""
    mine = refused(capsys, "advise=decode_slo", "--out", str(tmp_path / "x.csv"))
    main = run_cli("advise=decode_slo", cwd=tmp_path)
    assert main.returncode == 2 and mine == main.stderr.strip()
    assert "python -m harness.advise" in mine and not (tmp_path / "x.csv").exists()


def test_a_serving_run_is_refused(tmp_path, capsys):
    """A serving run's batches come from its request stream: its export held batch-1 rows, read back as a
    run that was no serving run (or refused for want of a card)."""
    line = refused(capsys, "workload.serving.enabled=true", "--out", str(tmp_path / "s.csv"))
    assert line.startswith("hostbound: error: workload.serving.enabled=true: ") and "workload.serving.enabled=false" in line
    assert not (tmp_path / "s.csv").exists()


def test_graph_padding_is_said_and_an_exact_bucket_reproduces(tmp_path, capsys):
    """acl_graph pads a batch of 3 to its capture size 4; an op list is never padded, so its read-back has no
    padding waste: the export says so. A batch of 4 is a capture size: no note, and the read-back's
    figures are the run's."""
    args = ["strategy=acl_graph", "workload.steps=2"]
    padded, notes = export(tmp_path, capsys, *args, "workload.batch_size=3", out="b3.csv")
    assert len(notes) == 2 and "pads each batch to its graph's capture size" in notes[1]
    run, back = figures([*args, "workload.batch_size=3"]), figures(padded)
    assert run["padding_waste"] > 0 == back["padding_waste"] and f"{run['padding_waste']:.1%}" in notes[1]
    exact, notes = export(tmp_path, capsys, *args, "workload.batch_size=4", out="b4.csv")
    assert not any("note" in line for line in notes)
    assert figures(exact) == figures([*args, "workload.batch_size=4"])


def test_shape_buckets_under_a_sunk_graph_are_said(tmp_path, capsys):
    """ge_sink with shape buckets: the run pads KV lengths to a block and loads one graph; read back, every
    step's KV length is a shape of its own (1 tok/s). The note says both."""
    back, notes = export(tmp_path, capsys, "strategy=ge_sink", "strategy.shape_buckets=true", "workload.steps=3")
    assert "strategy.shape_buckets=true pads KV lengths" in notes[-1] and "sunk graph" in notes[-1]
    assert figures(back)["graph_captures"] == 3 > figures(["strategy=ge_sink", "strategy.shape_buckets=true", "workload.steps=3"])["graph_captures"]


def test_an_experiments_read_back_reads_the_file(tmp_path, capsys):
    """An experiment's own workload keys applied over workload=trace: a card set there made the read-back run
    the card (the file ignored), and decode_kv_reads=per_query_head, priced into the file's bytes already,
    was refused without one. The read-back sets them back and reproduces the run."""
    args = ["experiment=a100_trtllm_llama2_70b_b240_decode", "workload.steps=2"]
    back, notes = export(tmp_path, capsys, *args)
    composed = compose_run(*back)
    assert composed.workload.card is None and composed.workload.path == str(tmp_path / "ops.csv")
    assert figures(back) == figures(args)
    falcon = compose_run(*export(tmp_path, capsys, "experiment=h100_trtllm_fp8_falcon180b_b1024_128_decode", "workload.steps=1", out="f.csv")[0])
    assert falcon.workload.card is None and falcon.workload.path == str(tmp_path / "f.csv")
    # An experiment of its own op list (a GEMM's rows): the read-back empties it, one source of ops a run.
    gemm = ["experiment=h100_gemm_m256_43008x5376"]
    back = export(tmp_path, capsys, *gemm, out="g.csv")[0]
    ran, read = figures(gemm), figures(back)
    # The op list's run says its tokens are batch_size's; the file written out holds each step's tokens.
    assert compose_run(*back).workload.ops == [] and ran.pop("throughput_note").startswith("tokens per step") and read == ran


def test_the_read_back_of_an_unfused_experiment_with_a_static_cache_runs(tmp_path, capsys):
    """gpt-fast's eager loop (a100_gptfast_eager: kernels=unfused, kv_cache=static): the file holds its
    in-place cache writes, and workload.kv_cache without a card is refused; the read-back sets it back to
    auto and gives the run's figures (it was refused once that refusal came in)."""
    args = ["experiment=a100_gptfast_eager", "workload.steps=4"]
    back, _ = export(tmp_path, capsys, *args)
    assert "workload.kv_cache=auto" in back and compose_run(*back).workload.card is None
    assert figures(back)["throughput_tok_s"] == pytest.approx(figures(args)["throughput_tok_s"], rel=1e-9)


def test_fusion_is_said_and_an_export_without_device_times_reproduces(tmp_path, capsys):
    """strategy.fusion=true prices a card's fused kernel once, from its members' FLOPs and bytes; read back
    from a file that holds each member's device_us, the fused kernel was their sum, each with its fixed cost
    (h100 Llama-2-7B batch 64 under the pipeline: 18.111 ms a step read back against the run's 17.913), and
    the export said nothing. It says so now, and --no-device-us gives a read-back with the run's figures."""
    args = ["hardware=h100", "strategy=pipeline", "strategy.fusion=true", "workload.batch_size=64", "workload.steps=2"]
    back, notes = export(tmp_path, capsys, *args)
    assert len(notes) == 2 and "strategy.fusion=true fuses" in notes[1] and "--no-device-us" in notes[1]
    run, read = figures(args), figures(back)
    assert read["step_ms_mean"] > run["step_ms_mean"] * 1.005
    export_ops([*args, "--no-device-us", "--out", str(tmp_path / "nd.csv")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert not any("note" in line for line in lines)
    unpriced = shlex.split(lines[-1].removeprefix("read it back: "))[3:]
    assert figures(unpriced)["step_ms_mean"] == pytest.approx(run["step_ms_mean"], rel=1e-9)
    # A run whose fusion merges nothing (no consecutive fusible vector ops) has nothing to say.
    assert not export(tmp_path, capsys, "hardware=h100", "strategy.fusion=true", "strategy.fusion_max_ops=1", "workload.steps=1", out="one.csv")[1][1:]
