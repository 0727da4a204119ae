"""Layer 8, cli: the commands — `python -m harness` (command.py, job.py), `harness.profile`,
`harness.export_ops`, `harness.repro`, `harness.report`. The modules named after a command at the
package's top level only call these."""
