"""The MLflow UI as a user sees it, in a real browser (Chromium driven by Playwright): a 2 × 2 sweep's
store served by `mlflow ui` on 127.0.0.1.

What is checked is what a user reads: the page the harness points to (store.view_url) is the runs table,
not MLflow 3.17's GenAI overview; its columns are the headline metrics; the sweep's jobs, under their
parent, are named by what the sweep varies and show their throughput; comparing two jobs shows the
throughput of both, the few params chosen and the headline metrics first; the parent run describes
itself with the sweep's comparison table and holds it and its plots as artifacts. Screenshots of every
page go to the test's folder (kept by pytest), named in the failure. Every process started is stopped.
"""
from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import free_port, run_cli, wait_until_up
from harness.tracking.store import view_url

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is a test extra: pip install -e '.[test]'")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (Debian: apt-get install chromium; .ci/run installs it)")

SWEEP = ["-m", "strategy=eager,acl_graph", "workload=llama2_7b_decode,qwen3_30b_decode", "workload.steps=4",
         "output.print_summary=false", "hydra.sweep.dir=sweep"]
JOBS = {f"{s}·{w}·atlas_a2·steps=4" for s in ("eager", "acl_graph") for w in ("llama2_7b_decode", "qwen3_30b_decode")}


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """(server address, store path, screenshot folder): the sweep's store, served until the module ends."""
    folder = tmp_path_factory.mktemp("ui")
    proc = run_cli(*SWEEP, cwd=folder, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", "sqlite:///outputs/mlflow.db", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        cwd=folder, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL, stderr=open(folder / "server.log", "w"), start_new_session=True,
    )
    address = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(f"{address}/health", server, 120)
        yield address, folder / "outputs" / "mlflow.db", folder
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait()


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


def opened(browser, url: str, shots: Path, name: str, ready: str):
    """A new page at `url`, once `ready` (a text) shows; a screenshot of it in `shots`."""
    page = browser.new_page(viewport={"width": 1600, "height": 1000})
    page.goto(url)
    try:
        page.get_by_text(ready).first.wait_for(timeout=60_000)
    finally:
        page.screenshot(path=str(shots / f"{name}.png"))
    return page


def settled(page, read, done, seconds: float = 60):
    """`read()` once `done(value)` holds, or its last value after `seconds`: MLflow draws a page in parts (the
    text a test waits for shows before the grid's columns and the plot's axes; a loaded CI machine read
    them empty), so a test reads what it checks until it has drawn."""
    for _ in range(int(seconds * 2)):
        value = read()
        if done(value):
            return value
        page.wait_for_timeout(500)
    return read()


def cells(page, column: str) -> list[str]:
    return page.locator(f'[role="gridcell"][col-id="{column}"]').all_inner_texts()


def test_the_runs_table_opens_with_the_headline_metrics_and_jobs_named_by_what_varies(ui, browser):
    address, _, shots = ui
    page = opened(browser, view_url(address, "1"), shots, "runs", "matching runs")
    wanted = {"Run Name", "headline/throughput_tok_s", "headline/step_ms_p50", "headline/step_ms_p99", "headline/bubble_ratio", "bound"}
    headers = settled(page, lambda: set(page.locator('[role="columnheader"]').all_inner_texts()), lambda found: wanted <= found)
    assert wanted <= headers, f"{headers}; see {shots}"
    names = cells(page, "attributes.`Run Name`")
    assert len(names) == 1 and "sweep atlas_a2·steps=4 · strategy=eager,acl_graph × workload=" in names[0], f"{names}; see {shots}"
    # The parent folds its jobs: open it.
    page.locator('[role="gridcell"][col-id="attributes.`Run Name`"]').first.locator("button").first.click()
    page.get_by_text("eager·llama2_7b_decode").first.wait_for(timeout=30_000)
    page.screenshot(path=str(shots / "runs_expanded.png"))
    names = [n.splitlines()[-1] for n in cells(page, "attributes.`Run Name`")]
    assert set(names[1:]) == JOBS, f"{names}; see {shots}"
    throughput = cells(page, "metrics.`headline/throughput_tok_s`")[1:]
    assert len(throughput) == 4 and all(float(t) > 0 for t in throughput), f"{throughput}; see {shots}"
    page.close()


def test_comparing_two_jobs_shows_the_throughput_of_both(ui, browser):
    """MLflow's compare page plots the runs on parallel coordinates with throughput_tok_s as the metric: its
    axis reads both runs' values (its metrics table sits below 120 parameters, in a scroll box)."""
    address, store, shots = ui
    with sqlite3.connect(store) as con:
        jobs = dict(con.execute("select name, run_uuid from runs where name like 'eager·%'").fetchall())
        throughput = dict(con.execute("select run_uuid, value from latest_metrics where key='headline/throughput_tok_s'").fetchall())
    ids = [jobs["eager·llama2_7b_decode·atlas_a2·steps=4"], jobs["eager·qwen3_30b_decode·atlas_a2·steps=4"]]
    runs = ",".join(f'"{i}"' for i in ids)
    page = opened(browser, f'{address}/#/compare-runs?runs=[{runs}]&experiments=["1"]', shots, "compare", "Run details")
    expected = [f"{throughput[run_id]:.5f}" for run_id in ids]

    def read() -> tuple[str, str]:
        plotted = " ".join(page.inner_text("body").split())
        plot = plotted[: plotted.index("Run details")]
        return plotted, plot[plot.rindex("throughput_tok_s"):]  # the metric axis's name, then its top and bottom values

    plotted, axis = settled(page, read, lambda text: all(value in text[1] for value in expected))
    page.screenshot(path=str(shots / "compare_plotted.png"))
    for run_id in ids:
        assert f"{throughput[run_id]:.5f}" in axis, f"{axis!r} lacks {throughput[run_id]:.5f}; see {shots}"
    # Below the plot: the handful of params that were chosen (what differs among them), then the metrics,
    # the headline ones first in MLflow's text order.
    details = plotted[plotted.index("Run details"):]
    params = details[details.index("Parameters Show diff only"):details.index("Metrics Show diff only")]
    assert "strategy eager eager" in params and "workload llama2_7b_decode qwen3_30b_decode" in params, f"{params!r}; see {shots}"
    assert params.count(" ") < 80 and "hardware.host.launch_us" not in params, f"{params!r}; see {shots}"
    metrics = details[details.index("Metrics Show diff only"):].split()[4:9]
    assert all(m.startswith("headline/") for m in metrics) and "headline/throughput_tok_s" in metrics, f"{metrics}; see {shots}"
    page.close()


def test_the_sweeps_parent_holds_its_comparison_table_and_plots(ui, browser):
    """The parent's page opens on its description, the comparison table the sweep printed (before "Show
    more": a speed-up visible without a click), and its artifacts are the table and the plots."""
    address, store, shots = ui
    with sqlite3.connect(store) as con:
        (parent,) = con.execute("select run_uuid from runs where name like 'sweep %'").fetchone()
    page = opened(browser, f"{address}/#/experiments/1/runs/{parent}", shots, "parent", "Description")
    description = page.locator("table").first
    header = description.locator("th").all_inner_texts()
    assert header[:4] == ["hardware", "workload", "strategy", "throughput_tok_s"] and "speedup_vs_eager" in header, f"{header}; see {shots}"
    first = description.locator("tr").nth(1).locator("td").all_inner_texts()
    assert first[:3] == ["atlas_a2", "llama2_7b_decode", "eager"] and first[header.index("speedup_vs_eager")] == "1.000", f"{first}; see {shots}"
    page.get_by_text("Show more").first.wait_for()
    page.close()
    page = opened(browser, f"{address}/#/experiments/1/runs/{parent}/artifacts", shots, "parent_artifacts", "results.md")
    for name in ("results.csv", "speedup.png", "bubble.png"):
        assert page.get_by_text(name).count() >= 1, f"{name}; see {shots}"
    page.close()
