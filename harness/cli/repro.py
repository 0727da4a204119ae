"""Reproduce the seeds' published measurements: the calibration and validation table.

    python -m harness.repro --out DIR [--claims FILE] [--only TEXT ...]

Every claim of `conf/claims.yaml` names the experiments it needs (`conf/experiment/<name>.yaml`, the
scenario: hardware, deployment, batch, strategy) and an expression over their summaries. This runs each
experiment once (tracking off), evaluates the claims and writes `DIR/repro.csv` and `DIR/repro.md`
(claim, published, simulated, unit, rel_error, role, …) and `DIR/experiments.csv` (every summary, with
what ran: batch, context, layout, steps, seed; not config_hash), and
prints how many claims of each role are within tolerance and the table of those that are not, each with
its one-line `why` (the README shows that table). Nothing in the table is typed in: change a preset and
the table changes.
"""
from __future__ import annotations

import argparse
import ast
import operator
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pandas as pd
from omegaconf import OmegaConf

from harness.config.paths import CONF_DIR
from harness.base.errors import HarnessError, one_line_text
from harness.base.stopping import held, raise_if_stopped
from harness.base.commands import CommandParser
from harness.base.files import atomic_write, check_folder, write_text

CLAIMS_FILE = CONF_DIR / "claims.yaml"
EXPERIMENT_DIR = CONF_DIR / "experiment"
# Largest |relative error| a claim may show, by role (issue: calibration ±10 %, validation ±25 %).
TOLERANCE = {"calibration": 0.10, "validation": 0.25}
CHECKS = ("value", "at_least")
COLUMNS = ["claim", "published", "simulated", "unit", "rel_error", "role", "ok", "check", "source", "fits", "note", "why"]


@dataclass
class Claim:
    claim: str
    source: str
    published: float
    unit: str
    role: str
    simulated: str  # expression over `<experiment>.<summary key>`
    check: str = "value"
    range: Optional[list] = None
    fits: str = ""
    note: str = ""
    why: str = ""  # the note in one line, for the table of claims out of tolerance
    experiments: list[str] = field(default_factory=list)


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _parse(expression: str, where: str) -> ast.Expression:
    try:
        return ast.parse(expression, mode="eval")
    except SyntaxError as err:
        raise HarnessError(f"{where} simulated={expression!r}: not an expression ({err.msg})") from None


def _experiments(tree: ast.AST, where: str) -> list[str]:
    """The experiments an expression reads, checking it uses only numbers, + - * /, and `<experiment>.<key>`."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if not isinstance(node.value, ast.Name):
                raise HarnessError(f"{where}: only <experiment>.<summary key> names are allowed")
            names.append(node.value.id)
        elif not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.USub, ast.Constant, ast.Name, ast.Load, *_OPERATORS)):
            raise HarnessError(f"{where}: {type(node).__name__} is not allowed (numbers, + - * /, <experiment>.<key>)")
    return list(dict.fromkeys(names))


def _evaluate(node: ast.AST, summaries: dict[str, dict], where: str) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, summaries, where)
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.UnaryOp):
        return -_evaluate(node.operand, summaries, where)
    if isinstance(node, ast.BinOp):
        return _OPERATORS[type(node.op)](_evaluate(node.left, summaries, where), _evaluate(node.right, summaries, where))
    if isinstance(node, ast.Attribute):
        summary = summaries[node.value.id]
        if node.attr not in summary:
            raise HarnessError(f"{where}: {node.value.id}.{node.attr}: no such summary key")
        return float(summary[node.attr])
    raise HarnessError(f"{where}: cannot evaluate {ast.dump(node)}")


def load_claims(path: Path = CLAIMS_FILE) -> list[Claim]:
    # A stop raised inside OmegaConf surfaced as its own AttributeError, reported as this file being
    # unreadable before the stop's line (see compose_run): it is taken after the load.
    with held():
        try:
            raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        except Exception as err:  # YAML syntax, duplicate keys: one line naming the file
            raise HarnessError(f"{path}: cannot read: {str(err).splitlines()[0]}") from None
    raise_if_stopped()
    if not isinstance(raw, dict) or not isinstance(raw.get("claims"), list):
        raise HarnessError(f"{path}: must hold a list under `claims:`")
    claims = []
    for i, entry in enumerate(raw["claims"]):
        where = f"{path.name} claims[{i}]"
        try:
            claim = Claim(**entry)
        except TypeError as err:
            raise HarnessError(f"{where}: {err}") from None
        if claim.role not in TOLERANCE:
            raise HarnessError(f"{where} role={claim.role!r}: must be one of {', '.join(TOLERANCE)}")
        if claim.check not in CHECKS:
            raise HarnessError(f"{where} check={claim.check!r}: must be one of {', '.join(CHECKS)}")
        if claim.range is not None and (len(claim.range) != 2 or not claim.range[0] <= claim.published <= claim.range[1]):
            raise HarnessError(f"{where} range={claim.range!r}: must be [low, high] around published={claim.published}")
        claim.experiments = _experiments(_parse(claim.simulated, where), where)
        for name in claim.experiments:
            if not (EXPERIMENT_DIR / f"{name}.yaml").is_file():
                raise HarnessError(f"{where} simulated: experiment {name!r}: no conf/experiment/{name}.yaml")
        claims.append(claim)
    if not claims:
        raise HarnessError(f"{path}: no claims")
    return claims


def run_experiment(name: str) -> dict:
    """The summary of `python -m harness +experiment=<name>`, simulated in this process, tracking off."""
    from harness.config.compose import compose_run
    from harness.sim.simulate import simulate_run

    from harness.cli.job import identity

    overrides = (f"+experiment={name}", "tracking.enabled=false")
    run = compose_run(list(overrides))
    # What ran (batch, context, layout, steps, seed, overrides), as the run's own summary.json records it.
    return {**run.names, **simulate_run(run).summary, **identity(run, overrides)}


def _ok(claim: Claim, simulated: float, rel_error: float) -> bool:
    if claim.check == "at_least" and simulated >= claim.published:
        return True
    if claim.range is not None and claim.range[0] <= simulated <= claim.range[1]:
        return True
    return abs(rel_error) <= TOLERANCE[claim.role]


def reproduce(claims: list[Claim]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(claims table, experiments table): every experiment the claims need, run once."""
    summaries: dict[str, dict] = {}
    for claim in claims:
        for name in claim.experiments:
            if name not in summaries:
                print(f"hostbound repro: running experiment {name}", file=sys.stderr)
                summaries[name] = run_experiment(name)
    rows = []
    for claim in claims:
        simulated = _evaluate(_parse(claim.simulated, claim.claim), summaries, claim.claim)
        rel_error = simulated / claim.published - 1.0
        rows.append(
            {
                "claim": claim.claim,
                "published": claim.published,
                "simulated": simulated,
                "unit": claim.unit,
                "rel_error": rel_error,
                "role": claim.role,
                "ok": _ok(claim, simulated, rel_error),
                "check": f"range {claim.range[0]:g}-{claim.range[1]:g}" if claim.range else claim.check,
                "source": claim.source,
                "fits": claim.fits,
                "note": claim.note,
                "why": claim.why,
            }
        )
    experiments = pd.DataFrame([{"experiment": name, **summary} for name, summary in summaries.items()])
    return pd.DataFrame(rows, columns=COLUMNS), experiments


def to_markdown(table: pd.DataFrame) -> str:
    shown = table.assign(
        published=table["published"].map("{:g}".format),
        simulated=table["simulated"].map("{:.4g}".format),
        rel_error=table["rel_error"].map("{:+.1%}".format),
        ok=table["ok"].map({True: "yes", False: "no (see note)"}),
    )
    notes = [f"{i + 1}. {row.claim}: {row.note}" for i, row in enumerate(table.itertuples()) if row.note]
    body = shown[["claim", "published", "simulated", "unit", "rel_error", "role", "ok", "source"]].to_markdown(index=False)
    fits = [f"- {row.claim}: {row.fits}" for row in table.itertuples() if row.fits]
    return "\n".join([body, "", "Fitted numbers (calibration claims):", *fits, "", "Notes:", *notes, ""])


def within_tolerance(table: pd.DataFrame) -> pd.Series:
    """The `ok` column as booleans, whether the table was built here or read back from repro.csv as text."""
    return table["ok"].astype(str) == "True"


def headline(table: pd.DataFrame) -> str:
    """How many claims of each role are within their tolerance, in one line (roles with no claim left out:
    `--only` may select one)."""
    ok = within_tolerance(table)
    parts = []
    for role, kind in (("calibration", "fitted"), ("validation", "predicted")):
        rows = table["role"] == role
        if rows.any():
            within = int((ok & rows).sum())
            parts.append(f"{int(rows.sum())} {role} ({kind}, ±{TOLERANCE[role]:.0%}): {within} within ({within / rows.sum():.0%})")
    return f"{len(table)} claims: " + "; ".join(parts)


def misses_markdown(table: pd.DataFrame) -> str:
    """The claims out of tolerance, each with its one-line why (the note has the evidence)."""
    out = table[~within_tolerance(table)]
    if out.empty:
        return "Every claim is within its tolerance."
    return pd.DataFrame({
        "claim": out["claim"],
        "published": out["published"].map("{:g}".format),
        "simulated": out["simulated"].map("{:.4g}".format),
        "unit": out["unit"],
        "error": out["rel_error"].map("{:+.0%}".format),
        "why": [why or "(see its note)" for why in out["why"].fillna("")],
    }).to_markdown(index=False)


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m harness.repro", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for repro.csv, repro.md, experiments.csv")
    parser.add_argument("--claims", type=Path, default=CLAIMS_FILE, help="claims file (default: conf/claims.yaml)")
    parser.add_argument("--only", nargs="+", metavar="TEXT", help="only claims whose text contains one of these (case-insensitive)")
    args = parser.parse_args(argv)
    try:
        check_folder("--out", args.out)
        if not args.claims.is_file():
            raise HarnessError(f"--claims={args.claims}: no such file")
        claims = load_claims(args.claims)
        if args.only:
            wanted = [w.lower() for w in args.only]
            claims = [c for c in claims if any(w in c.claim.lower() for w in wanted)]
            if not claims:
                raise HarnessError(f"--only={' '.join(args.only)}: matches no claim")
        table, experiments = reproduce(claims)
    except HarnessError as err:
        print(f"hostbound repro: error: {one_line_text(str(err))}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "repro.csv", lambda tmp: table.to_csv(tmp, index=False))
    atomic_write(args.out / "experiments.csv", lambda tmp: experiments.to_csv(tmp, index=False))
    summary = "\n".join([headline(table), "", "Out of tolerance:", "", misses_markdown(table), ""])
    markdown = to_markdown(table)
    write_text(args.out / "repro.md", markdown + "\n" + summary)
    print(markdown)
    print(summary)
    # A claim out of tolerance that no note explains is a regression to look at; one without a one-line
    # why leaves the README's table of misses saying only "(see its note)".
    out = ~within_tolerance(table)
    for column, what in (("note", "a note"), ("why", "a one-line why")):
        missing = table[out & (table[column] == "")]
        if not missing.empty:
            print(f"hostbound repro: {len(missing)} claim(s) out of tolerance without {what}: {'; '.join(missing['claim'])}", file=sys.stderr)
            return 1
    return 0
