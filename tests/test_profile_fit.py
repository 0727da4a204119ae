"""A machine fitted from a profile (`python -m harness.profile TRACE --fit NAME`): the preset's values
are the trace's, by hand on a synthetic trace, and `hardware=NAME` finds it from the launch folder."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness.cli.profile import main as profile_main
from harness.config.compose import compose_run
from harness.advisor.candidates import with_steps
from harness.sim.simulate import simulate_run
from synthetic_trace import Layout, kineto_trace


@pytest.fixture
def synthetic(tmp_path, monkeypatch):
    """Two steps of two ops (tests/test_profile_import.py: test_synthetic_trace_measures_by_hand): a step's
    framework time is 10 + 12 + 2 µs, each launch 5 µs, the sync's own time 3 µs; kernel 1 is launched
    while kernel 0 runs and starts as it ends (a gap of 0)."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps(kineto_trace(Layout(steps=2, ops=2))))
    return path


def test_a_fitted_machine_holds_the_traces_costs_and_the_base_presets_rest(synthetic, tmp_path, capsys):
    profile_main([str(synthetic), "--out", "profiled", "--fit", "lab_box", "--base", "a100"])
    said = capsys.readouterr().out
    assert "fitted machine conf/hardware/lab_box.yaml (from a100): python -m harness hardware=lab_box" in said
    preset = yaml.safe_load((tmp_path / "conf" / "hardware" / "lab_box.yaml").read_text())
    assert preset["defaults"] == ["a100", "_self_"] and preset["name"] == "lab_box"
    assert preset["host"] == {
        "framework_us": pytest.approx(24 / 2),  # per launch: 24 µs a step over its 2 launches
        "infer_shape_us": 0, "tiling_us": 0, "alloc_us": 0, "free_us": 0,  # inside the framework op in a Kineto trace
        "launch_us": pytest.approx(5.0),
        "sync_us": pytest.approx(3.0),  # one sync a step, 3 µs of its own
        "module_us": 0,  # no nn.Module call in the trace: their Python, if any, is in framework_us
        "speed": 1.0,
    }
    assert preset["device"] == {"kernel_gap_us": 0.0}
    assert "graph" not in preset  # no graph launched
    measured = json.loads((tmp_path / "profiled" / "profile.json").read_text())
    assert preset["device"]["kernel_gap_us"] == measured["kernel_gap_us"]

    run = compose_run(["hardware=lab_box", "workload.steps=2"])  # found in the launch folder's conf/
    base = compose_run(["hardware=a100", "workload.steps=2"])
    assert run.hardware.name == "lab_box"
    assert (run.hardware.host.framework_us, run.hardware.host.launch_us, run.hardware.host.sync_us) == (12.0, 5.0, 3.0)
    assert run.hardware.device == base.hardware.device.__class__(**{**vars(base.hardware.device), "kernel_gap_us": 0.0})
    assert run.hardware.link == base.hardware.link and run.hardware.graph == base.hardware.graph
    # The fitted costs reach the simulation: a kernel's host time is 12 + 5 µs here against a100's
    # 4.52 + 3.3 µs, so the host works ~2.2× as long a step.
    fitted, shipped = simulate_run(run).summary, simulate_run(base).summary
    host_ms = {name: s["host_busy_max"] * s["step_ms_mean"] for name, s in (("fitted", fitted), ("shipped", shipped))}
    assert 2.0 < host_ms["fitted"] / host_ms["shipped"] < 2.3


@pytest.fixture
def host_bound(tmp_path, monkeypatch):
    """The synthetic steps with 2 µs kernels: the host (10 µs before each launch, 5 µs launches) bounds them."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "host_bound.json"
    path.write_text(json.dumps(kineto_trace(Layout(steps=2, ops=2, kernel_us=2.0))))
    return path


def test_the_profilers_work_comes_off_every_host_stage_alike(host_bound, tmp_path, capsys):
    """The host works 10 + 5 µs before and in each of a step's two launches, plus 4 µs between steps (in
    the framework time): 2 x (12 + 5) = 34 µs a step. Told the step took 8.5 µs less without the profiler,
    the fit takes a quarter off each stage: 12 -> 9 µs framework, 5 -> 3.75 launch (the sync's own time
    stays)."""
    profile_main([str(host_bound), "--out", "first", "--fit", "as_traced", "--base", "a100"])
    traced = json.loads((tmp_path / "first" / "profile.json").read_text())
    assert traced["bound"] == "host"
    as_traced = yaml.safe_load((tmp_path / "conf" / "hardware" / "as_traced.yaml").read_text())
    assert (as_traced["host"]["framework_us"], as_traced["host"]["launch_us"]) == (pytest.approx(12.0), pytest.approx(5.0))
    capsys.readouterr()
    unprofiled_ms = traced["step_ms_mean"] - 0.0085
    profile_main([str(host_bound), "--out", "profiled", "--fit", "lab_box", "--base", "a100", "--unprofiled-step-ms", repr(unprofiled_ms)])
    assert "the host costs are the trace's x 0.75" in capsys.readouterr().err
    text = (tmp_path / "conf" / "hardware" / "lab_box.yaml").read_text()
    preset = yaml.safe_load(text)
    assert (preset["host"]["framework_us"], preset["host"]["launch_us"]) == (pytest.approx(9.0), pytest.approx(3.75))
    assert preset["host"]["sync_us"] == as_traced["host"]["sync_us"] and preset.get("device") == as_traced.get("device")
    assert f"--unprofiled-step-ms {unprofiled_ms:.12g}" in text.splitlines()[0]


def test_the_profilers_share_comes_off_the_module_calls_too_and_nothing_else():
    """without_profiler by hand: 2 steps of 3 launched ops, 10 + 2 µs of host work each before its launch:
    72 µs of host work, 36 a step. A step 9 µs shorter without the profiler leaves 3/4 of every host
    stage, the module calls' own time included; the sync and the device's values stay."""
    import pandas as pd

    from harness.importers.fit import LAUNCH_STAGES, Fitted, without_profiler

    ops = pd.DataFrame({f"{stage}_us": [0.0] * 6 for stage in LAUNCH_STAGES})
    ops["framework_us"], ops["launch_us"] = 10.0, 2.0
    fitted = [Fitted("host.framework_us", 8.0, "f"), Fitted("host.launch_us", 2.0, "l"), Fitted("host.module_us", 4.0, "m"),
              Fitted("host.sync_us", 3.0, "s"), Fitted("device.kernel_gap_us", 1.0, "g"), Fitted("host.tiling_us", 0.0, "t")]
    scaled, factor = without_profiler(fitted, ops, steps=2, traced_step_ms=0.050, unprofiled_step_ms=0.041)
    assert factor == pytest.approx(0.75)
    assert {f.key: f.value for f in scaled} == pytest.approx({"host.framework_us": 6.0, "host.launch_us": 1.5, "host.module_us": 3.0,
                                                              "host.sync_us": 3.0, "device.kernel_gap_us": 1.0, "host.tiling_us": 0.0})
    assert all("x 0.75 for the profiler's own work" in f.note for f in scaled[:3]) and scaled[3].note == "s"


@pytest.mark.parametrize(
    "trace, unprofiled, message",
    [
        ("host_bound", "1000", "not below the traced step"),
        ("host_bound", "0.0001", "more than the host's whole work before its launches"),
        ("synthetic", "0.0001", "the traced steps are device-bound, so their time does not show the profiler's host work"),
    ],
)
def test_an_unprofiled_step_the_trace_cannot_have_is_refused_and_no_preset_written(request, tmp_path, capsys, trace, unprofiled, message):
    with pytest.raises(SystemExit) as stopped:
        profile_main([str(request.getfixturevalue(trace)), "--out", "profiled", "--fit", "lab_box", "--base", "a100", "--unprofiled-step-ms", unprofiled])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hostbound: error: --unprofiled-step-ms {unprofiled}: ") and message in err and "\n" not in err
    assert not (tmp_path / "conf" / "hardware" / "lab_box.yaml").exists()


def test_advice_on_a_fitted_machine_is_for_that_machine(synthetic, tmp_path, capsys):
    """`python -m harness.advise hardware=NAME …` with a machine fitted here: its candidates run on the fitted
    host costs (an eager decode's host time ~2.2× a100's, as above), not the base preset's."""
    from harness.advisor.search import advise_runs, figures
    from harness.config.advise import AdviseConfig

    profile_main([str(synthetic), "--out", "profiled", "--fit", "lab_box", "--base", "a100"])
    question = AdviseConfig(steps=[2], space={"strategy": ["eager"], "workload.batch_size": [1]})
    fitted, shipped = (advise_runs([f"hardware={name}"], question).ranked[0] for name in ("lab_box", "a100"))
    assert fitted.run.hardware.name == "lab_box" and fitted.run.hardware.host.launch_us == 5.0
    host_ms = [c.summary["host_busy_max"] * c.summary["step_ms_mean"] for c in (fitted, shipped)]
    assert 2.0 < host_ms[0] / host_ms[1] < 2.3
    assert figures(fitted.summary)["tpot_ms_p50"] != figures(shipped.summary)["tpot_ms_p50"]
    assert fitted.summary == simulate_run(with_steps(compose_run(["hardware=lab_box", "strategy=eager", "workload.batch_size=1"]), 2)).summary | {
        k: fitted.summary[k] for k in ("sim_wall_s", "compile_s", "serving")}  # the advice records whether it served


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--fit", "9box"], "--fit '9box': a preset name is a letter, then up to 63 letters, digits or _"),
        (["--fit", "h100"], "--fit h100: a shipped hardware preset has that name; choose another"),
        (["--fit", "box", "--base", "h900"], "--base h900: no such hardware preset; choose from a100, atlas_a2, b200, h100, h200, l40s, mi300x"),
        (["--base", "h100"], "--base h100: only with --fit NAME"),
        (["--fit", "taken"], "--fit taken: conf/hardware/taken.yaml exists; remove it or choose another name"),
        (["--unprofiled-step-ms", "5"], "--unprofiled-step-ms 5: only with --fit NAME"),
        (["--fit", "box", "--unprofiled-step-ms", "0"], "--unprofiled-step-ms 0: must be a finite step time above 0 ms"),
        (["--fit", "box", "--unprofiled-step-ms", "nan"], "--unprofiled-step-ms nan: must be a finite step time above 0 ms"),
    ],
)
def test_a_bad_fit_request_is_refused_in_one_line_before_anything_is_written(synthetic, tmp_path, capsys, extra, message):
    taken = tmp_path / "conf" / "hardware" / "taken.yaml"
    taken.parent.mkdir(parents=True)
    taken.write_text("name: taken\n")
    with pytest.raises(SystemExit) as stopped:
        profile_main([str(synthetic), "--out", "profiled", *extra])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip() == f"hostbound: error: {message}"
    assert not (tmp_path / "profiled").exists()
    assert taken.read_text() == "name: taken\n"
    assert sorted(p.name for p in taken.parent.iterdir()) == ["taken.yaml"]


def test_a_machine_fitted_from_one_public_trace_predicts_another_groups_measurement(tmp_path, monkeypatch, capsys):
    """Out of sample: fitted on HF transformers' Qwen1.5-0.5B forward on an MI300X host (a TraceLens test
    trace), the A100 predicts gpt-fast's plain PyTorch Llama-2-7B decode, batch 1 (25.5 tok/s eager, 107.0
    compiled: 4.2×; PyTorch blog "Accelerating Generative AI Part II") within the validation tolerance,
    where the shipped a100 preset is out by 3× (conf/claims.yaml). Neither number is read by the fit."""
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    trace = Path(__file__).parent / "data" / "traces" / "tl_qwen05b_mi300.json.gz"
    profile_main([str(trace), "--out", "profiled", "--fit", "hf_host", "--base", "a100"])
    # An MI300X's kernel floor, GEMM rate and front end say nothing of an A100: only the host is the trace's.
    preset = yaml.safe_load((tmp_path / "conf" / "hardware" / "hf_host.yaml").read_text())
    assert set(preset) == {"defaults", "name", "host"}
    assert "the trace ran on another device (AMD Instinct MI300X VF) than a100: only its host costs are fitted" in capsys.readouterr().err
    eager = simulate_run(compose_run(["+experiment=a100_gptfast_eager", "hardware=hf_host"])).summary
    compiled = simulate_run(compose_run(["+experiment=a100_gptfast_compiled", "hardware=hf_host"])).summary
    assert eager["throughput_tok_s"] == pytest.approx(25.5, rel=0.25)
    assert eager["step_ms_mean"] / compiled["step_ms_mean"] == pytest.approx(107.0 / 25.5, rel=0.25)


@pytest.mark.parametrize(
    "keep, message",
    [("::0", "--keep '::0': a slice's step cannot be 0"), ("a:b", "--keep 'a:b': not a slice A:B of step numbers")],
)
def test_a_bad_keep_is_refused_in_one_line_before_anything_is_written(synthetic, tmp_path, capsys, keep, message):
    with pytest.raises(SystemExit) as stopped:
        profile_main([str(synthetic), "--out", "profiled", "--keep", keep])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip() == f"hostbound: error: {message}"
    assert not (tmp_path / "profiled").exists()


# Device values from a trace's shapes (harness/importers/fit.py: device_fits), by hand.
BF16 = "c10::BFloat16"


def test_a_gemms_work_follows_its_operands_shapes():
    from harness.importers.fit import matmul_work

    # addmm(bias, A[M,K], B[K,N]): 2·M·N·K FLOPs; the bias, A, B and the output read or written once, 2 bytes each.
    assert matmul_work("aten::addmm", [[1024], [8944, 1024], [1024, 1024], [], []], [BF16, BF16, BF16, "Scalar", "Scalar"]) == (
        2.0 * 8944 * 1024 * 1024, 2.0 * (1024 + 8944 * 1024 + 1024 * 1024 + 8944 * 1024))
    assert matmul_work("aten::bmm", [[2, 3, 4], [2, 4, 5]], ["c10::Half"] * 2) == (2.0 * 2 * 3 * 5 * 4, 2.0 * 2 * (12 + 20 + 15))
    assert matmul_work("aten::bmm", [[2, 3, 4], [2, 4, 5]], ["float", "float"]) is None  # not what the BF16 / FP16 peak prices
    assert matmul_work("aten::mm", [[3, 4], [5, 6]], [BF16, BF16]) is None  # inner sizes differ: not a GEMM's operands
    assert matmul_work("aten::bmm", [[2, 3, 4], [3, 4, 5]], [BF16, BF16]) is None  # batches differ
    assert matmul_work("aten::mm", [[3, 4]], [BF16]) is None  # shapes not recorded in full


def test_an_element_wise_ops_bytes_are_its_inputs_and_one_output():
    from harness.importers.fit import pointwise_bytes

    n = 16 * 559 * 1024
    # x * rms: read both (the second broadcast), write one the size of the larger.
    assert pointwise_bytes("aten::mul", [[16, 559, 1024], [16, 559, 1]], [BF16, BF16]) == 2 * (n + 16 * 559) + 2 * n
    # copy_(dst bf16, src float): writes dst, reads src; the scalar moves nothing.
    assert pointwise_bytes("aten::copy_", [[16, 559, 1024], [16, 559, 1024], []], [BF16, "float", "Scalar"]) == 2 * n + 4 * n
    assert pointwise_bytes("aten::add", [[], []], ["Scalar", "Scalar"]) is None  # no tensor


def _shaped(rows):
    import pandas as pd

    return pd.DataFrame(rows, columns=["name", "dims", "types", "device_us", "kernels"])


def test_the_kernel_floor_is_the_median_of_tiny_element_wise_kernels_and_needs_five():
    from harness.importers.fit import TINY_BYTES, device_fits

    base = compose_run(["hardware=h100"]).hardware.device
    at_limit = TINY_BYTES // 2 // 2  # elements of one bf16 input whose read + write is exactly 256 KiB
    tiny = [("aten::rsqrt", [[at_limit]], [BF16], us, 1) for us in (4.0, 4.5, 5.0, 6.0)]
    assert device_fits(_shaped(tiny), base) == []  # four: too few
    five = tiny + [("aten::neg", [[8]], [BF16], 4.2, 1)]
    (floor,) = device_fits(_shaped(five), base)
    assert (floor.key, floor.value) == ("device.vector_fixed_us", 4.5)
    assert floor.note.startswith("median time of 5 element-wise kernels moving 256 KiB or less (neg, rsqrt); p10 ")
    # One element more is no longer tiny, an op of two kernels does not say what one costs, a GEMM is no element-wise op.
    over = [("aten::rsqrt", [[at_limit + 1]], [BF16], 9.0, 1), ("aten::add", [[8], [8]], [BF16, BF16], 9.0, 2), ("aten::mm", [[1, 1], [1, 1]], [BF16, BF16], 9.0, 1)]
    (floor,) = device_fits(_shaped(five + over), base)
    assert floor.value == 4.5


def test_matmul_efficiency_comes_from_compute_bound_gemms_on_every_core():
    from harness.importers.fit import device_fits

    base = compose_run(["hardware=h100"]).hardware.device  # 989 TFLOPS, matmul_fixed_us 3
    flops = 2.0 * 4096**3
    # 4096³ at 400 TFLOPS of work after the fixed 3 µs: 0.4044 of the peak.
    busy_us = flops / 400e6
    big = [("aten::mm", [[4096, 4096], [4096, 4096]], [BF16, BF16], busy_us + 3.0, 1)] * 5
    # A decode GEMV (memory-bound) and a GEMM too small to hold every core price other things: left out.
    gemv = [("aten::mm", [[1, 4096], [4096, 4096]], [BF16, BF16], 20.0, 1)] * 5
    small = [("aten::mm", [[64, 64], [64, 64]], [BF16, BF16], 4.0, 1)] * 5
    fits = device_fits(_shaped(big + gemv[:4] + small), base)
    assert [f.key for f in fits] == ["device.matmul_efficiency"]
    assert fits[0].value == pytest.approx(400 / 989)
    assert fits[0].note.startswith("5 compute-bound GEMMs on all cores: 0.687 TFLOP")
    assert device_fits(_shaped(big[:4] + gemv[:4] + small), base) == []  # four of each: too few
    # On half the SMs the peak is half (a core's peak is the hardware's): the same times are twice the fraction.
    (halved,) = device_fits(_shaped(big), compose_run(["hardware=h100", "hardware.device.ai_cores=66"]).hardware.device)
    assert halved.value == pytest.approx(2 * 400 / 989)


def test_hbm_efficiency_comes_from_gemms_that_read_their_weights():
    from harness.importers.fit import LARGE_BYTES, device_fits

    base = compose_run(["hardware=h100"]).hardware.device  # 3,350 GB/s, matmul_fixed_us 3
    # A decode GEMV, 1 × 4096 by 4096 × 4096 in bf16: 2 · (4096 + 4096² + 4096) bytes, read at 2.0 TB/s after the fixed 3 µs.
    moved = 2.0 * (4096 + 4096 * 4096 + 4096)
    gemv = [("aten::mm", [[1, 4096], [4096, 4096]], [BF16, BF16], 3.0 + moved / 2.0e6, 1)] * 5
    (fit,) = device_fits(_shaped(gemv), base)
    assert fit.key == "device.hbm_efficiency"
    assert fit.value == pytest.approx(2000 / 3350)
    assert fit.note.startswith("5 memory-bound GEMMs of 8 MB or more: 0.168 GB")
    # Under 8 MB a GEMV's time is as much the floor as the traffic: left out, as are compute-bound GEMMs.
    width = 1400  # 2 · (1 + 1400² + 1400) bytes < 8 MB
    assert 2.0 * (1 + width * width + width) < LARGE_BYTES
    small = [("aten::mm", [[1, width], [width, width]], [BF16, BF16], 5.0, 1)] * 5
    assert device_fits(_shaped(gemv[:4] + small), base) == []


def test_a_machine_fitted_from_a_trace_with_shapes_predicts_a_sibling_engines_prefill(tmp_path, monkeypatch):
    """Out of sample, on one device: fitted on HF transformers' Qwen1.5-0.5B forward on an MI300X (a
    TraceLens test trace recorded with shapes), the kernel floor and GEMM rate predict SGLang's Qwen3-8B
    prefill on an MI300X (another TraceLens trace: 492.8 ms of device work, 15 prompts of 1,024 tokens;
    conf/claims.yaml) within 20 %, closer than the best tuned GEMM's rate does (29 % short). The shipped
    mi300x preset holds these values since."""
    from pathlib import Path

    from harness.importers import load_profile

    monkeypatch.chdir(tmp_path)
    trace = Path(__file__).parent / "data" / "traces" / "tl_qwen05b_mi300.json.gz"
    profile = load_profile(trace)
    launched = profile.calls[profile.calls["op_id"] >= 0]
    assert (profile.framework_ops["name"].to_numpy()[launched["op_id"]] == launched["op"].to_numpy()).all()
    profile_main([str(trace), "--out", "profiled", "--fit", "mi300x_hf", "--base", "mi300x"])
    device = yaml.safe_load((tmp_path / "conf" / "hardware" / "mi300x_hf.yaml").read_text())["device"]
    assert 4.2 < device["vector_fixed_us"] < 5.0  # rsqrt, add, fill of a few thousand elements
    assert 0.38 < device["matmul_efficiency"] < 0.47  # ~550 of 1307 TFLOPS on 1,024-wide GEMMs, less the 9.7 us floor
    assert "hbm_efficiency" not in device  # no memory-bound GEMM in a 16 × 559-token forward; element-wise ops do not set it
    def device_ms(*overrides: str) -> float:
        run = simulate_run(compose_run(["+experiment=mi300x_sglang_qwen3_8b_extend", *overrides])).summary
        return run["step_ms_mean"] * run["device_busy"]

    fitted = device_ms("hardware=mi300x_hf")
    best_gemm_tflops = 668.4  # MAMF with TunableOp (stas00/ml-engineering), as conf/hardware/mi300x.yaml cites it
    best_gemm_share = best_gemm_tflops / compose_run(["hardware=mi300x"]).hardware.device.cube_tflops
    best_gemm = device_ms("hardware=mi300x_hf", f"hardware.device.matmul_efficiency={best_gemm_share}")
    assert fitted == pytest.approx(492.8, rel=0.20)
    assert abs(fitted / 492.8 - 1) < abs(best_gemm / 492.8 - 1)


@pytest.mark.parametrize("trace_name, preset", [("tl_qwen05b_h100", "h100"), ("tl_qwen05b_h100", "h200"), ("tl_qwen05b_mi300", "mi300x")])
def test_the_shipped_kernel_floor_and_gemm_rate_are_the_ones_measured_on_that_device(trace_name, preset):
    """The presets' `vector_fixed_us` and `matmul_efficiency` (and, on H100, `kernel_gap_us`: the mean gap
    between queued kernels, as --fit writes it) are what these public traces of the device measure; a
    preset edited away from its source fails here."""
    from pathlib import Path

    from harness.importers import load_profile
    from harness.importers.fit import device_fits, front_end_gaps_us, shaped_ops
    from harness.importers.steps import import_profile

    imported = import_profile(load_profile(Path(__file__).parent / "data" / "traces" / f"{trace_name}.json.gz"))
    device = compose_run([f"hardware={preset}"]).hardware.device
    fitted = {f.key: f.value for f in device_fits(shaped_ops(imported), device)}
    assert fitted["device.vector_fixed_us"] == pytest.approx(device.vector_fixed_us, abs=0.05)
    assert fitted["device.matmul_efficiency"] == pytest.approx(device.matmul_efficiency, abs=0.001)
    if trace_name == "tl_qwen05b_h100":
        assert float(np.mean(front_end_gaps_us(imported)[0])) == pytest.approx(device.kernel_gap_us, abs=0.005)


def test_a_trace_recorded_with_the_profilers_costly_options_says_so_in_the_fitted_preset(tmp_path, monkeypatch, capsys):
    """Stacks, shapes and memory events cost the profiler host time on every op, and a fitted host pays it:
    the preset's header, a warning and profile.json say which options the trace was recorded with."""
    monkeypatch.chdir(tmp_path)
    data = kineto_trace(Layout(steps=2, ops=2))
    data.update({"record_shapes": 1, "with_stack": 1, "profile_memory": 0})
    (tmp_path / "t.json").write_text(json.dumps(data))
    profile_main(["t.json", "--out", "profiled", "--fit", "stacked"])
    warned = "the trace was recorded with record_shapes, with_stack: the profiler's own host work per op is in the fitted host costs"
    unnamed = "the trace's device (Synthetic GPU) is no shipped preset's: only its host costs are fitted, the device's are h100's; pass --base PRESET"
    said = capsys.readouterr().err
    assert warned in said and unnamed in said
    text = (tmp_path / "conf" / "hardware" / "stacked.yaml").read_text()
    assert f"# Note: {warned}" in text and f"# Note: {unnamed}" in text
    assert set(yaml.safe_load(text)) == {"defaults", "name", "host"}  # a device nobody named is not fitted
    assert json.loads((tmp_path / "profiled" / "profile.json").read_text())["recorded_with"] == ["record_shapes", "with_stack"]


def test_a_module_calls_own_time_is_its_time_outside_the_ops_and_modules_it_holds(tmp_path):
    """By hand: a 100 µs module holds a 30 µs op and a 40 µs child module, which holds a 10 µs op (itself
    holding a nested 4 µs op): their own times are 100 - 30 - 40 = 30 and 40 - 10 = 30 µs. A module on
    another thread, and python_function events that are not module calls, change nothing."""
    from harness.importers import load_profile
    from harness.importers.fit import fit_machine

    def event(cat, name, ts, dur, tid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}

    trace = {"traceEvents": [
        event("python_function", "nn.Module: Outer_0", 1000, 100),
        event("cpu_op", "aten::mm", 1010, 30),
        event("python_function", "torch/nn/functional.py(1): linear", 1045, 50),  # not a module: the parent's own Python
        event("python_function", "nn.Module: Inner_0", 1050, 40),
        event("cpu_op", "aten::add", 1060, 10),
        event("cpu_op", "aten::empty", 1061, 4),
        event("python_function", "nn.Module: Elsewhere_0", 1000, 80, tid=2),
        event("kernel", "k", 1100, 5, device=0, stream=7, correlation=1),
    ]}
    path = tmp_path / "modules.json"
    path.write_text(json.dumps(trace))
    calls = load_profile(path).module_calls
    mine = calls[calls["thread"] == 1].sort_values("start_us")
    assert mine["own_us"].tolist() == [30.0, 30.0]
    assert calls[calls["thread"] == 2]["own_us"].tolist() == [80.0]
    # The fit takes module Python out of the framework time a launch and prices it per call.
    import pandas as pd

    ops = pd.DataFrame({"framework_us": [70.0, 20.0], "launch_us": [5.0, 5.0], **{f"{s}_us": [0.0, 0.0] for s in ("infer_shape", "tiling", "alloc", "free")},
                        "kind": ["kernel", "kernel"], "in_graph": [0, 0]})
    fitted = {f.key: f.value for f in fit_machine(ops, 1, 0.0, np.zeros(0), np.zeros(0), np.array([30.0, 30.0]))}
    assert fitted["host.framework_us"] == pytest.approx((90 - 60) / 2) and fitted["host.module_us"] == pytest.approx(30.0)


def test_a_graph_launch_is_fitted_as_a_replays_launch_not_as_a_kernels():
    """A step of two kernels launched alone (3 and 1 µs, 12 and 8 µs of framework before them) and a graph
    of two tasks launched in 10 µs after 40 µs of framework: the kernels' launch is (3 + 1) / 2 = 2 µs and
    their framework (12 + 8) / 2 = 10 µs; the graph's 10 µs is graph.replay_launch_us (it was averaged in:
    (10 + 3 + 1) / 3). A trace of graph launches alone fits no per-kernel host stage."""
    import pandas as pd

    from harness.importers.fit import fit_machine

    zeros = {f"{s}_us": [0.0] * 4 for s in ("infer_shape", "tiling", "alloc", "free")}
    ops = pd.DataFrame({"framework_us": [12.0, 8.0, 40.0, 0.0], "launch_us": [3.0, 1.0, 10.0, 0.0], **zeros,
                        "kind": ["cube", "vector", "cube", "vector"], "in_graph": [0, 0, 1, 1]})
    fitted = {f.key: f.value for f in fit_machine(ops, 1, 0.0, np.zeros(0), np.zeros(0))}
    assert (fitted["host.launch_us"], fitted["host.framework_us"], fitted["graph.replay_launch_us"]) == (2.0, 10.0, 10.0)
    graph_only = {f.key for f in fit_machine(ops[ops["in_graph"] == 1], 1, 0.0, np.zeros(0), np.zeros(0))}
    assert graph_only == {"graph.replay_launch_us"}


def test_leaving_a_graph_is_fitted_apart_from_the_gap_between_eager_kernels(tmp_path, monkeypatch):
    """A graph piece (kernels [15,20] and [20,22]), then two kernels launched alone, both queued before the
    piece ended (launch calls end at 17 and 21): the first starts 8 µs after the piece's last kernel, the
    second 2 µs after the first. kernel_gap_us is the 2 (the eager pair alone); graph.exit_gap_us is what
    leaving the graph adds to it, 8 - 2 = 6; profile.json keeps both measured gaps."""
    from synthetic_trace import device_task, runtime_call, trace_file

    monkeypatch.chdir(tmp_path)
    events = [
        runtime_call("cudaGraphLaunch", 10, 4, 1), device_task("piece0_gemm", 15, 5, 1), device_task("piece0_norm", 20, 2, 1),
        runtime_call("cudaLaunchKernel", 14, 3, 2), device_task("attention", 30, 6, 2),
        runtime_call("cudaLaunchKernel", 18, 3, 3), device_task("o_proj", 38, 2, 3),
        runtime_call("cudaStreamSynchronize", 60, 2),
    ]
    profile_main([trace_file(tmp_path, events), "--out", "profiled", "--fit", "exits", "--base", "h100"])
    preset = yaml.safe_load((tmp_path / "conf" / "hardware" / "exits.yaml").read_text())
    assert preset["device"]["kernel_gap_us"] == pytest.approx(2.0)
    assert preset["graph"]["exit_gap_us"] == pytest.approx(6.0)
    measured = json.loads((tmp_path / "profiled" / "profile.json").read_text())
    assert (measured["kernel_gap_us"], measured["graph_exit_gap_us"]) == (pytest.approx(2.0), pytest.approx(8.0))
    # The replay runs the trace's own gaps: 2 µs behind a kernel, 6 more after the graph's.
    replay = (tmp_path / "profiled" / "replay.txt").read_text().split()
    assert "hardware.device.kernel_gap_us=2" in replay and "hardware.graph.exit_gap_us=6" in replay
    # Without the second kernel there is no kernel-to-kernel gap to take off: the exit is the whole 8 µs.
    (tmp_path / "conf" / "hardware" / "exits.yaml").unlink()
    profile_main([trace_file(tmp_path, events[:-3] + events[-1:]), "--out", "profiled", "--fit", "exits", "--base", "h100"])
    graph = yaml.safe_load((tmp_path / "conf" / "hardware" / "exits.yaml").read_text())["graph"]
    assert graph["exit_gap_us"] == pytest.approx(8.0)


def test_the_mi300x_graph_exit_is_the_one_its_piecewise_trace_measures_and_a_sibling_agrees():
    """mi300x's graph.exit_gap_us is what --fit finds at vLLM V1's 25 piecewise boundaries of an MI300X
    trace (12.48 µs after a piece, less that trace's 1.12 µs between kernels launched alone); the gap that
    trace measures after a piece is within 10 % of the one after another MI300X trace's whole-forward
    graph (11.68 µs, -6 %): a preset edited away from its source fails here."""
    from pathlib import Path

    from harness.importers import load_profile
    from harness.importers.fit import front_end_gaps_us
    from harness.importers.steps import import_profile

    def gaps(name: str) -> tuple[np.ndarray, np.ndarray]:
        return front_end_gaps_us(import_profile(load_profile(Path(__file__).parent / "data" / "traces" / f"{name}.json.gz")))

    eager, exits = gaps("tl_vllm_prefilldecode_piecewise_mi300")
    assert exits.size == 25 and eager.size == 36
    assert exits.mean() - eager.mean() == pytest.approx(compose_run(["hardware=mi300x"]).hardware.graph.exit_gap_us, abs=0.05)
    _, whole = gaps("tl_vllm_decode_fullgraph_amd")
    assert whole.size == 1
    assert exits.mean() == pytest.approx(float(whole[0]), rel=0.10)


def test_allocations_most_launches_do_not_pay_are_a_one_off_not_a_per_op_cost():
    """Five launches, each after 10 µs of framework and in 5 µs; one of them after a 500 µs allocation. The
    median launch allocates nothing, so host.alloc_us is 0, commented with the 0.5 ms and the one call it came
    from (the mean had made it 500 / 5 = 100 µs an op). Where most launches allocate (0, 0, 30, 30, 40: median
    30) the mean stays, 100 / 5 = 20 µs; tiling, a cost of every op that tiles, keeps its mean (50 / 5 = 10 µs)
    however few pay it."""
    import pandas as pd

    from harness.importers.fit import fit_machine

    def ops(alloc, tiling=(0.0,) * 5):
        return pd.DataFrame({"framework_us": [10.0] * 5, "launch_us": [5.0] * 5, "alloc_us": list(alloc), "tiling_us": list(tiling),
                             "infer_shape_us": [0.0] * 5, "free_us": [0.0] * 5, "kind": ["vector"] * 5, "in_graph": [0] * 5})

    fitted = {f.key: f for f in fit_machine(ops([0, 0, 0, 0, 500.0], [0, 0, 0, 0, 50.0]), 1, 0.0, np.zeros(0), np.zeros(0), alloc_calls=1)}
    assert (fitted["host.alloc_us"].value, fitted["host.tiling_us"].value, fitted["host.framework_us"].value) == (0.0, 10.0, 10.0)
    assert fitted["host.alloc_us"].note.startswith("0.5 ms a step in 1 call before 1 of 5 launches, left out as one-off")
    common = {f.key: f.value for f in fit_machine(ops([0, 0, 30.0, 30.0, 40.0]), 1, 0.0, np.zeros(0), np.zeros(0), alloc_calls=3)}
    assert common["host.alloc_us"] == 20.0


def test_alexnets_cudamalloc_calls_are_left_out_of_the_fitted_alloc_cost():
    """AlexNet's measured forward: 27 framework ops, 40 launches, five cudaMalloc calls of 32,814 µs in all
    before 4 launches (p50 0): host.alloc_us is 0 and says so (it was 32.81 ms / 27 = 1215.33 µs an op);
    framework (1.949 ms / 27 = 72.19 µs) and launch (0.372 ms / 27 = 13.78 µs) are as before."""
    from harness.importers import load_profile
    from harness.importers.fit import allocation_calls, fit_machine, repeat_launches
    from harness.importers.measure import measured_summary
    from harness.importers.steps import import_profile, ops_table
    from test_profile_import import trace

    imported = import_profile(load_profile(trace("hta_alexnet_a100")))
    summary = measured_summary(imported)
    fitted = {f.key: f for f in fit_machine(ops_table(imported), len(imported.kept), summary["host_ms_sync"], np.zeros(0), np.zeros(0),
                                            repeats=repeat_launches(imported), alloc_calls=allocation_calls(imported))}
    assert allocation_calls(imported) == 5 and fitted["host.alloc_us"].value == 0.0
    assert fitted["host.alloc_us"].note.startswith("32.81 ms a step in 5 calls before 4 of 40 launches, left out as one-off")
    assert fitted["host.framework_us"].value == pytest.approx(1949 / 27) and fitted["host.launch_us"].value == pytest.approx(372 / 27)


def test_values_fitted_from_too_few_measurements_are_named_and_a_graph_launch_is_a_host_cost(tmp_path, monkeypatch, capsys):
    """Two steps of two ops: every host stage is a mean of 4 launches and the sync of 2 calls, said in a
    warning and in the preset (a mean of 6 launches, one of them 9.4 ms of Python, had predicted a 1.3 s
    step of another model without a word); 25 steps are enough. A graph's launch call is host work: fitted
    without --base too (vLLM's full-graph MI300X trace: 1 launch of 506.8 us, the only one: named)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "few.json").write_text(json.dumps(kineto_trace(Layout(steps=2, ops=2))))
    profile_main(["few.json", "--out", "few", "--fit", "few", "--base", "a100"])
    said = [line for line in capsys.readouterr().err.splitlines() if "fewer than 20 measurements" in line]
    assert len(said) == 1 and "host.framework_us (4)" in said[0] and "host.launch_us (4)" in said[0] and "host.sync_us (2)" in said[0]
    assert "fewer than 20 measurements: " in (tmp_path / "conf" / "hardware" / "few.yaml").read_text()
    (tmp_path / "many.json").write_text(json.dumps(kineto_trace(Layout(steps=25, ops=2))))
    profile_main(["many.json", "--out", "many", "--fit", "many", "--base", "a100"])
    assert "fewer than 20" not in capsys.readouterr().err + (tmp_path / "conf" / "hardware" / "many.yaml").read_text()
    trace = Path(__file__).parent / "data" / "traces" / "tl_vllm_decode_fullgraph_amd.json.gz"
    profile_main([str(trace), "--out", "graph", "--fit", "graph_box"])
    fitted = yaml.safe_load((tmp_path / "conf" / "hardware" / "graph_box.yaml").read_text())
    assert fitted["graph"]["replay_launch_us"] == pytest.approx(506.768, abs=0.001)
    assert "graph.replay_launch_us (1)" in capsys.readouterr().err
