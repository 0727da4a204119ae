"""The calibration and validation table: claims file, experiments, and a table computed from the presets.

The README's summary (how many claims are within, and every miss with its why) and docs/calibration.md's
table are this table's: `python tests/test_repro.py` reruns the repro and rewrites both.
"""
from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
import subprocess
import sys

import pandas as pd
import pytest
from omegaconf import OmegaConf

import harness.config.schema
import harness.model.workload
from conftest import compose_run
from harness.config.paths import REPO_ROOT, WORKLOADS_DIR
from harness.base.errors import HarnessError
from harness.cli.repro import TOLERANCE, headline, load_claims, main, misses_markdown, reproduce, within_tolerance


@pytest.fixture(scope="module")
def repro_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("repro")
    proc = subprocess.run([sys.executable, "-m", "harness.repro", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_claims_file_fits_at_most_a_third_and_names_what_it_fits():
    claims = load_claims()
    calibration = [c for c in claims if c.role == "calibration"]
    assert 0 < len(calibration) <= len(claims) / 3
    assert all(c.fits for c in calibration)
    assert not any(c.fits for c in claims if c.role == "validation")


def test_every_claim_is_in_the_table_within_tolerance_or_explained(repro_dir):
    table = pd.read_csv(repro_dir / "repro.csv", keep_default_na=False)
    assert {"claim", "published", "simulated", "unit", "rel_error", "role"} <= set(table.columns)
    assert table["claim"].tolist() == [c.claim for c in load_claims()]
    assert set(table["role"]) == {"calibration", "validation"}
    recomputed = table["simulated"].astype(float) / table["published"].astype(float) - 1
    assert recomputed.to_numpy() == pytest.approx(table["rel_error"].astype(float).to_numpy())
    unexplained = table[(table["ok"].astype(str) != "True") & (table["note"] == "")]
    assert unexplained.empty, unexplained[["claim", "simulated", "rel_error"]]
    for row in table[table["check"] == "value"].itertuples():
        if not row.note:
            assert abs(float(row.rel_error)) <= TOLERANCE[row.role], row.claim
    markdown = (repro_dir / "repro.md").read_text()
    assert all(claim in markdown for claim in table["claim"])
    experiments = pd.read_csv(repro_dir / "experiments.csv")
    assert set(experiments["experiment"]) == {e for c in load_claims() for e in c.experiments}
    # What each ran, so a claim's batch or TP can be checked from this file alone (as from summary.json).
    falcon = experiments.set_index("experiment").loc["a100_trtllm_falcon180b_ttft128"]
    assert (falcon["batch_size"], falcon["tp"], falcon["phase"], falcon["context_len"]) == (1, 8, "prefill", 128)
    assert falcon["overrides"] == "+experiment=a100_trtllm_falcon180b_ttft128 tracking.enabled=false"


def test_changing_a_fitted_value_in_the_preset_changes_the_table(tmp_path, monkeypatch):
    claims = [c for c in load_claims() if c.claim.startswith("DeepSeek-V3.1")]
    before, _ = reproduce(claims)
    cards = tmp_path / "workloads"
    shutil.copytree(WORKLOADS_DIR, cards)
    text = (cards / "deepseek_v3.yaml").read_text()
    assert "layer_overhead_us: 1734.0" in text
    (cards / "deepseek_v3.yaml").write_text(text.replace("layer_overhead_us: 1734.0", "layer_overhead_us: 2500.0"))
    monkeypatch.setattr(harness.config.schema, "WORKLOADS_DIR", cards)
    monkeypatch.setattr(harness.model.workload, "WORKLOADS_DIR", cards)
    after, _ = reproduce(claims)
    eager = before["claim"] == "DeepSeek-V3.1 eager decode step, Atlas A2"
    # 61 decoder layers each pay 766 us more in eager; graph replay skips the front end.
    assert after.loc[eager, "simulated"].item() - before.loc[eager, "simulated"].item() == pytest.approx(61 * 0.766, rel=1e-6)
    assert after.loc[eager, "rel_error"].item() > before.loc[eager, "rel_error"].item() + 0.2
    graph = before["claim"] == "DeepSeek-V3.1 ACL graph decode step, Atlas A2"
    assert after.loc[graph, "simulated"].item() == pytest.approx(before.loc[graph, "simulated"].item(), rel=1e-9)
    speedup = before["claim"] == "DeepSeek-V3.1 ACL graph speed-up over eager"
    assert after.loc[speedup, "simulated"].item() > before.loc[speedup, "simulated"].item()


def test_card_overrides_sweep_the_fitted_value_without_editing_cards():
    base = compose_run("+experiment=a2_deepseek_eager")
    assert base.workload.card_overrides == {}
    run = compose_run("+experiment=a2_deepseek_eager", "+workload.card_overrides.layer_overhead_us=2000")
    assert run.workload.card_overrides == {"layer_overhead_us": 2000}
    with pytest.raises(HarnessError, match=r"workload.card_overrides.not_a_field=1: card 'deepseek_v3' has no such field"):
        harness.model.workload.build_workload(compose_run("+experiment=a2_deepseek_eager", "+workload.card_overrides.not_a_field=1").workload)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"simulated": "nope.step_ms_mean"}, "experiment 'nope': no conf/experiment/nope.yaml"),
        ({"simulated": "__import__('os').getcwd()"}, "Call is not allowed"),
        ({"role": "guess"}, "role='guess': must be one of calibration, validation"),
        ({"check": "about"}, "check='about': must be one of value, at_least"),
        ({"simulated": "a2_llama2_host.step_ms_mean +"}, "not an expression"),
        ({"colour": "red"}, "unexpected keyword argument 'colour'"),
    ],
)
def test_bad_claims_file_is_one_line_naming_the_key(tmp_path, capsys, changes, message):
    entry = {"claim": "c", "source": "s", "published": 1.0, "unit": "ms", "role": "validation", "simulated": "a2_llama2_host.step_ms_mean", **changes}
    claims = tmp_path / "claims.yaml"
    OmegaConf.save(OmegaConf.create({"claims": [entry]}), claims)
    out = tmp_path / "out"
    assert main(["--out", str(out), "--claims", str(claims)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_unreadable_claims_file_is_one_line(tmp_path, capsys):
    claims = tmp_path / "claims.yaml"
    claims.write_text("claims:\n  - claim: a\n    claim: b\n")  # duplicate key
    assert main(["--out", str(tmp_path / "out"), "--claims", str(claims)]) == 2
    err = capsys.readouterr().err.strip()
    assert "claims.yaml" in err and len(err.splitlines()) == 1


def test_experiments_compose_from_the_command_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "+experiment=a2_runtime_30x7", "tracking.enabled=false", "workload.steps=2",
         "output.timeline_steps=0", f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "runtime_30x7 on atlas_a2 with eager" in proc.stdout
    assert "214 ops/step, 214 launches/step" in proc.stdout  # 30 layers x 7 kernels + embedding, norm, head, sampling


def test_tensorrt_llm_v0_6_1_gqa_decode_reads_a_kv_head_once_per_query_head():
    """v0.6.1 has no XQA kernel: its masked MHA runs a thread block per query head, each reading the KV head
    it shares (docs/validation.md). Every decode experiment of its tables that runs a GQA model says so;
    a new one that forgets it would price its attention at an eighth (Llama-2-70B) of the bytes."""
    checked = {}
    for path in sorted((REPO_ROOT / "conf" / "experiment").glob("*trtllm*_decode.yaml")):
        if "v0.6.1" not in path.read_text().split("defaults:")[0]:
            continue
        run = compose_run(f"+experiment={path.stem}")
        card = harness.model.workload.load_card(run.workload.card)
        gqa = card["num_key_value_heads"] < card["num_attention_heads"]
        checked[path.stem] = (gqa, run.workload.decode_kv_reads.value)
    gqa_reads = {name: reads for name, (gqa, reads) in checked.items() if gqa}
    assert len(gqa_reads) == 13, sorted(gqa_reads)  # Llama-2-70B and Falcon 180B rows, A100 FP16 and H100 FP8
    assert set(gqa_reads.values()) == {"per_query_head"}, gqa_reads
    assert len(checked) > len(gqa_reads)  # the MHA models' experiments were looked at too


def readme_summary(table: pd.DataFrame) -> str:
    """The README's block: the headline and the table of claims out of tolerance."""
    return f"{headline(table)}\n\n{misses_markdown(table)}\n"


def calibration_table(repro_md: str) -> str:
    """repro.md's table of every claim (docs/calibration.md shows it)."""
    return repro_md.split("\n\n", 1)[0] + "\n"


README_BLOCK = re.compile(r"^\d+ claims: [^\n]*\n\n(?:(?:\|[^\n]*\n)+|Every claim is within its tolerance\.\n)", re.M)
CALIBRATION_BLOCK = re.compile(r"^\| claim [^\n]*\n(?:\|[^\n]*\n)+", re.M)


def test_every_claim_out_of_tolerance_says_why_in_one_line(repro_dir):
    table = pd.read_csv(repro_dir / "repro.csv", keep_default_na=False)
    out = table[~within_tolerance(table)]
    assert (out["why"] != "").all(), out.loc[out["why"] == "", "claim"].tolist()
    assert all(len(why) <= 110 and "\n" not in why for why in table["why"])
    summary = readme_summary(table)
    assert summary.startswith(f"{len(table)} claims: ") and len(re.findall(r"^\| (?!claim|:-)", summary, re.M)) == len(out)
    validation = table[table["role"] == "validation"]
    assert f"{len(validation)} validation (predicted, ±25%): {int(within_tolerance(validation).sum())} within" in summary
    written = (repro_dir / "repro.md").read_text()
    assert headline(table) in written and misses_markdown(table) in written


def test_the_summary_counts_each_role_apart_and_reads_a_table_back_from_text():
    """Three validation claims (one out, its why missing: the note is pointed to), no calibration claim (as
    `--only` may select): the headline says only the role it has; `ok` read back as text counts the same;
    no miss at all says so, and the README's block still matches it."""
    table = pd.DataFrame({"claim": ["a", "b", "c"], "published": [1.0, 2.0, 3.0], "simulated": [1.1, 3.0, 3.0], "unit": ["ms"] * 3,
                          "rel_error": [0.1, 0.5, 0.0], "role": ["validation"] * 3, "ok": [True, False, True], "why": ["", float("nan"), ""]})
    expected = "3 claims: 3 validation (predicted, ±25%): 2 within (67%)"
    assert headline(table) == expected and headline(table.assign(ok=table["ok"].astype(str))) == expected
    misses = misses_markdown(table.assign(ok=table["ok"].astype(str)))
    assert re.findall(r"^\| (b) .*\| (\S+)\s+\| \(see its note\) \|$", misses, re.M) == [("b", "+50%")]
    none_out = table.assign(ok=True)
    assert misses_markdown(none_out) == "Every claim is within its tolerance."
    assert README_BLOCK.fullmatch(readme_summary(none_out)) and README_BLOCK.fullmatch(readme_summary(table))


def test_the_readme_and_the_calibration_record_show_todays_table(repro_dir):
    """No number in the docs that the presets no longer give: rerun `python tests/test_repro.py` when they move."""
    table = pd.read_csv(repro_dir / "repro.csv", keep_default_na=False)
    assert readme_summary(table) in (REPO_ROOT / "README.md").read_text(), "README's repro summary is stale"
    assert calibration_table((repro_dir / "repro.md").read_text()) in (REPO_ROOT / "docs" / "calibration.md").read_text(), (
        "docs/calibration.md's table is stale")


if __name__ == "__main__":
    # The harness imported is the installed one: rewrite only its own checkout's files, and only from it.
    assert REPO_ROOT == Path(__file__).resolve().parents[1], f"the harness imported is {REPO_ROOT}'s: run this from there"
    with tempfile.TemporaryDirectory() as scratch:
        assert main(["--out", scratch]) == 0
        fresh = pd.read_csv(Path(scratch) / "repro.csv", keep_default_na=False)
        repro_md = (Path(scratch) / "repro.md").read_text()
    for path, pattern, block in ((REPO_ROOT / "README.md", README_BLOCK, readme_summary(fresh)),
                                 (REPO_ROOT / "docs" / "calibration.md", CALIBRATION_BLOCK, calibration_table(repro_md))):
        text = path.read_text()
        assert len(pattern.findall(text)) == 1, f"{path}: the block to rewrite is not there once"
        path.write_text(pattern.sub(lambda _: block, text))
        print(f"rewrote the repro table in {path}")
