"""`python -m harness.profile TRACE --out DIR`: the folder holds one run's files, so an earlier run's
what-if never sits beside another trace's profile (harness/cli/profile.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.base.errors import HarnessError
from harness.cli import profile
from harness.cli.profile import WHATIF_CSV, WHATIF_MD

TRACES = Path(__file__).parent / "data" / "traces"
GP100, ALEXNET = TRACES / "hta_gpu_annot_gp100.json.gz", TRACES / "hta_alexnet_a100.json.gz"


def notes(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("hostbound: note: ")]


def test_a_run_without_what_if_removes_an_earlier_runs(tmp_path, capsys):
    """gp100 with --what-if, then alexnet into the same folder without it: gp100's whatif.csv / whatif.md stayed
    beside alexnet's profile.json. They go, said in one line; a run with nothing to remove says nothing."""
    out = tmp_path / "out"
    profile.main([str(GP100), "--out", str(out), "--what-if"])
    assert (out / WHATIF_CSV).is_file() and (out / WHATIF_MD).is_file()
    capsys.readouterr()
    profile.main([str(ALEXNET), "--out", str(out)])
    said = notes(capsys)
    assert len(said) == 1 and WHATIF_CSV in said[0] and WHATIF_MD in said[0]
    assert not (out / WHATIF_CSV).exists() and not (out / WHATIF_MD).exists()
    assert json.loads((out / "profile.json").read_text())["trace"] == str(ALEXNET)
    profile.main([str(ALEXNET), "--out", str(out)])
    assert notes(capsys) == []


def test_a_refused_what_if_or_fit_leaves_the_earlier_run_as_it_was(tmp_path, capsys, monkeypatch):
    """Alexnet with --what-if into a folder, then gp100 into it with a --fit that is refused
    (--unprofiled-step-ms 5 is not below gp100's traced 1.573 ms step), or with a what-if that stops: each
    exits 2 having written nothing. They had removed alexnet's whatif.csv / whatif.md and replaced its
    profile.json, ops.csv and replay.txt with gp100's before refusing."""
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    profile.main([str(ALEXNET), "--out", str(out), "--what-if"])
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert {WHATIF_CSV, WHATIF_MD, "profile.json"} <= set(before)
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        profile.main([str(GP100), "--out", str(out), "--fit", "z", "--unprofiled-step-ms", "5"])
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hostbound: error: ") and "1.573 ms" in err[0]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not (tmp_path / "conf" / "hardware" / "z.yaml").exists()

    def stop(*_args):
        raise HarnessError("the what-if stopped")

    monkeypatch.setattr(profile, "what_if", stop)
    with pytest.raises(SystemExit) as ended:
        profile.main([str(GP100), "--out", str(out), "--what-if"])
    assert ended.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == ["hostbound: error: the what-if stopped"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
