"""Resumable sweeps (issue 15 item 2): a sweep stopped mid-way and re-run with resume=true ends with the
results of an uninterrupted one, no run left RUNNING and no configuration logged twice."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import comparable_results, compose_run
from harness.results.resume import RESUMED_FILE, config_hash, find_finished
from harness.cli.job import execute

SWEEP = ["-m", "strategy=eager,async,pipeline,acl_graph", "workload.steps=300", "output.timeline_steps=0", "output.print_summary=false"]
ENV = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}


def sweep(cwd: Path, folder: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", *SWEEP, f"hydra.sweep.dir={folder}",
                             f"tracking.uri=sqlite:///{cwd / (folder + '.db')}", *extra],
                            cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_an_interrupted_sweep_resumed_matches_an_uninterrupted_one(tmp_path):
    whole = sweep(tmp_path, "whole")
    cut = sweep(tmp_path, "cut")
    deadline = time.monotonic() + 240
    while len(list((tmp_path / "cut").glob("*/summary.json"))) < 2:
        assert time.monotonic() < deadline and cut.poll() is None, "the sweep ended before it could be interrupted"
        time.sleep(0.1)
    cut.send_signal(signal.SIGTERM)
    cut.communicate(timeout=60)
    assert cut.returncode == -signal.SIGTERM
    finished = len(list((tmp_path / "cut").glob("*/summary.json")))  # written last: these jobs finished
    assert 2 <= finished < 4, "nothing was left to resume"
    assert whole.wait(timeout=300) == 0, whole.stderr.read()[-2000:]

    resumed = sweep(tmp_path, "cut", "resume=true")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-2000:]
    assert err.count("resumed: ") == finished  # the finished jobs were not simulated again

    assert comparable_results(pd.read_csv(tmp_path / "cut" / "results.csv")).equals(comparable_results(pd.read_csv(tmp_path / "whole" / "results.csv")))
    with sqlite3.connect(tmp_path / "cut.db") as con:
        runs = con.execute("select name, status from runs").fetchall()
    jobs = [(name, status) for name, status in runs if not name.startswith("sweep ")]
    assert "RUNNING" not in {status for _, status in runs}
    finished_jobs = [name for name, status in jobs if status == "FINISHED"]
    assert len(finished_jobs) == 4 and len(set(finished_jobs)) == 4  # each configuration logged once
    # One parent: the interrupted sweep's (KILLED by the stop), opened again and finished by the resume.
    assert sorted(status for name, status in runs if name.startswith("sweep ")) == ["FINISHED"]


def test_the_configuration_hash_ignores_where_files_go_but_not_what_is_simulated():
    base = {"workload.batch_size": 8, "seed": 0, "tracking.uri": None, "output.trace_steps": 2, "resume": False}
    assert config_hash(base) == config_hash({**base, "tracking.uri": "http://x", "output.trace_steps": 0, "resume": True})
    assert config_hash(base) != config_hash({**base, "seed": 1})
    assert config_hash(base) != config_hash({**base, "workload.batch_size": 16})


def test_resume_reuses_a_finished_run_from_another_folder(tmp_path):
    run = compose_run("workload.steps=3", "output.timeline_steps=0", "tracking.enabled=false")
    params = {"workload.steps": 3, "seed": 0}
    first = execute(run, tmp_path / "outputs" / "runs" / "a", params)
    again = execute(compose_run("workload.steps=3", "output.timeline_steps=0", "tracking.enabled=false", "resume=true"),
                    tmp_path / "outputs" / "runs" / "b", params, outputs_dir=tmp_path / "outputs")
    assert again.resumed_from == tmp_path / "outputs" / "runs" / "a"
    assert (tmp_path / "outputs" / "runs" / "b" / RESUMED_FILE).read_text().strip() == str(again.resumed_from)
    assert json.loads((tmp_path / "outputs" / "runs" / "b" / "summary.json").read_text()) == json.loads(
        (tmp_path / "outputs" / "runs" / "a" / "summary.json").read_text())
    assert again.summary["throughput_tok_s"] == first.summary["throughput_tok_s"]
    assert find_finished(config_hash({**params, "seed": 1}), tmp_path / "c", tmp_path / "outputs") is None


def test_resume_takes_the_run_folder_not_mlflows_copy_of_it(tmp_path):
    """A tracked run's files are copied to outputs/mlartifacts/<id>/artifacts, which sorts before
    outputs/runs: resume=true took the copy for the finished run (RESUMED_FROM.txt named it) and, not
    finding it logged, logged the run to MLflow a second time."""
    run_dir = tmp_path / "outputs" / "runs" / "a"
    cli = [sys.executable, "-m", "harness", "workload.steps=3", "output.timeline_steps=0", "output.print_summary=false"]
    first = subprocess.run([*cli, f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=ENV, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert list((tmp_path / "outputs" / "mlartifacts").rglob("summary.json"))  # the copy is there to be mistaken
    again = subprocess.run([*cli, f"hydra.run.dir={tmp_path / 'outputs' / 'runs' / 'b'}", "resume=true"], cwd=tmp_path, env=ENV,
                           capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "outputs" / "runs" / "b" / RESUMED_FILE).read_text().strip() == str(run_dir)
    with sqlite3.connect(tmp_path / "outputs" / "mlflow.db") as con:
        assert con.execute("select count(*) from runs").fetchone() == (1,)


def test_resume_never_overwrites_a_finished_run_of_another_configuration(tmp_path):
    """`resume=true` into a folder that holds another configuration's finished run refuses in one line and
    keeps that run's files (it simulated over them: batch 2 written where batch 1 was)."""
    base = [sys.executable, "-m", "harness", "tracking.enabled=false", "workload.steps=3", "output.timeline_steps=0", "hydra.run.dir=run"]
    assert subprocess.run(base, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=ENV).returncode == 0
    before = (tmp_path / "run" / "summary.json").read_bytes()
    proc = subprocess.run(base + ["workload.batch_size=2", "resume=true"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=ENV)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"resume=true: {tmp_path / 'run'} holds a finished run of another configuration" in proc.stderr
    assert (tmp_path / "run" / "summary.json").read_bytes() == before
    again = subprocess.run(base + ["resume=true"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=ENV)
    assert again.returncode == 0 and f"already finished in {tmp_path / 'run'} (resume=true)" in again.stdout, again.stderr[-2000:]


def test_resume_refuses_a_sweep_of_other_overrides_in_a_sweeps_folder(tmp_path):
    """A sweep resumed in a folder must be the sweep that folder holds: another one overwrote its jobs'
    folders (job 0 of batch 2 in job 0 of eager's) and multirun.yaml, and results.md mixed the two."""
    base = [sys.executable, "-m", "harness", "-m", "tracking.enabled=false", "workload.steps=3", "output.timeline_steps=0",
            "output.print_summary=false", "hydra.sweep.dir=sweep"]
    assert subprocess.run(base + ["strategy=eager,async"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV).returncode == 0
    before = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "sweep").rglob("*") if p.is_file()}
    proc = subprocess.run(base + ["workload.batch_size=2,4", "resume=true"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert ("hydra.sweep.dir=sweep: holds a sweep of other overrides (workload.steps=3 strategy=eager,async); resume=true finishes"
            " that sweep: run this one (workload.steps=3 workload.batch_size=2,4) in a new folder") in proc.stderr
    assert {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "sweep").rglob("*") if p.is_file()} == before
    # The same sweep, where-and-how options moved around, resumes: nothing simulated again, and its
    # results.csv records each job's overrides as the uninterrupted sweep did (not Hydra's `resume=True`).
    results = pd.read_csv(tmp_path / "sweep" / "results.csv")
    same = subprocess.run(base + ["resume=true", "strategy=eager,async"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV)
    assert same.returncode == 0, same.stderr[-2000:]
    assert len(list((tmp_path / "sweep").glob("*/RESUMED_FROM.txt"))) == 0 and "resumed" in same.stderr + same.stdout
    assert pd.read_csv(tmp_path / "sweep" / "results.csv")["overrides"].tolist() == results["overrides"].tolist()
    assert not results["overrides"].str.contains("resume|True").any()


def test_a_resumed_sweep_keeps_one_parent_run_with_every_job_under_it(tmp_path):
    """A sweep interrupted before its second job finished (no summary, no MLflow run), resumed: its jobs
    are the children of one parent run, which counts both (a second parent was made, with the one job
    that ran again, and the first kept the other; both said '2 jobs')."""
    import mlflow

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = [sys.executable, "-m", "harness", "-m", f"tracking.uri={store}", "workload.steps=3", "output.timeline_steps=0",
               "output.print_summary=false", "hydra.sweep.dir=sweep", "strategy=eager,async"]
    assert subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV).returncode == 0
    client = mlflow.MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("hostbound").experiment_id
    second = next((tmp_path / "sweep").glob("1_*"))
    (second / "summary.json").unlink()
    client.delete_run(next(r.info.run_id for r in client.search_runs([experiment]) if r.data.tags.get("run_dir", "").endswith(second.name)))
    resumed = subprocess.run(command + ["resume=true"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    runs = client.search_runs([experiment])
    parents = [r for r in runs if r.data.tags.get("kind") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].info.run_id == (tmp_path / "sweep" / "mlflow_parent_run_id").read_text().strip()
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(children) == 2 and parents[0].data.metrics["jobs"] == 2


def test_a_sweeps_axes_in_another_order_are_another_sweep():
    """Hydra numbers a sweep's jobs (and names their folders) by its axes in order: the same axes swapped
    put other jobs under the same numbers, so resuming one as the other is refused; single values and
    where-and-how keys may move."""
    from harness.cli.command import _sweep_identity

    sweep = ["workload.steps=3", "strategy=eager,async", "workload.batch_size=1,2"]
    assert _sweep_identity(sweep) != _sweep_identity(["workload.steps=3", "workload.batch_size=1,2", "strategy=eager,async"])
    assert _sweep_identity(sweep) == _sweep_identity(["strategy=eager,async", "resume=true", "workload.batch_size=1,2", "tracking.enabled=false", "workload.steps=3"])


def test_resuming_many_jobs_reads_each_earlier_summary_once(tmp_path, monkeypatch):
    """Each job of a resumed sweep used to read every summary.json under outputs/ again: N jobs over M
    earlier runs read N × M files. Now the folder is read once per process, and a match is checked again."""
    import harness.results.resume as resume

    digests = [f"{i:016x}" for i in range(40)]
    for i, digest in enumerate(digests):
        folder = tmp_path / "outputs" / "runs" / f"r{i}"
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps({"config_hash": digest}))
        (folder / "steps.parquet").write_bytes(b"")
    reads = []
    real_loads = resume.json.loads
    monkeypatch.setattr(resume.json, "loads", lambda text, **kw: reads.append(1) or real_loads(text, **kw))
    for i, digest in enumerate(digests):
        assert find_finished(digest, tmp_path / "sweep" / f"{i}", tmp_path / "outputs") == tmp_path / "outputs" / "runs" / f"r{i}"
    assert find_finished("f" * 16, tmp_path / "sweep" / "x", tmp_path / "outputs") is None
    assert len(reads) == 2 * len(digests)  # the index (40) and each match checked again (40), not 40 × 40


def test_the_configuration_hash_covers_the_files_a_run_reads(tmp_path, monkeypatch):
    """The config names a trace CSV or a model card, but an edited file under the same name is another
    run: a CSV edited and rerun with resume=true copied the old run's numbers. The CSV by its bytes, the
    card by its content (a comment edited there is the same card)."""
    import shutil

    import harness.config.paths as paths

    csv = tmp_path / "ops.csv"
    csv.write_text("step,name,kind,device_us\n0,mm,cube,100\n1,mm,cube,100\n")
    trace = {"workload.card": None, "workload.path": str(csv), "seed": 0}
    before = config_hash(trace)
    assert config_hash(trace) == before
    csv.write_text("step,name,kind,device_us\n0,mm,cube,1000\n1,mm,cube,1000\n")
    assert config_hash(trace) != before

    cards = tmp_path / "workloads"
    cards.mkdir()
    shutil.copy(paths.WORKLOADS_DIR / "llama2_7b.yaml", cards / "llama2_7b.yaml")
    monkeypatch.setattr(paths, "WORKLOADS_DIR", cards)
    card = {"workload.card": "llama2_7b", "workload.path": None, "seed": 0}
    before = config_hash(card)
    text = (cards / "llama2_7b.yaml").read_text()
    (cards / "llama2_7b.yaml").write_text("# a comment\n" + text)
    assert config_hash(card) == before
    (cards / "llama2_7b.yaml").write_text(text.replace("num_hidden_layers: 32", "num_hidden_layers: 16"))
    assert config_hash(card) != before


def test_resume_simulates_an_edited_trace_csv_again(tmp_path, monkeypatch):
    """End to end: the same overrides over an edited CSV are simulated, not copied from the earlier run."""
    monkeypatch.chdir(tmp_path)
    csv = tmp_path / "ops.csv"
    csv.write_text("step,name,kind,device_us\n" + "".join(f"{s},mm,cube,100\n{s},add,vector,10\n" for s in range(4)))
    overrides = ["workload=trace", f"workload.path={csv}", "output.timeline_steps=0", "tracking.enabled=false"]
    params = {"workload.card": None, "workload.path": str(csv), "seed": 0}
    first = execute(compose_run(*overrides), tmp_path / "outputs" / "runs" / "a", params)
    csv.write_text(csv.read_text().replace(",100\n", ",1000\n"))
    again = execute(compose_run(*overrides, "resume=true"), tmp_path / "outputs" / "runs" / "b", params, outputs_dir=tmp_path / "outputs")
    assert again.resumed_from is None
    assert again.summary["throughput_tok_s"] < first.summary["throughput_tok_s"] / 5
