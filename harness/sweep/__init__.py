"""Layer 7, sweep: multirun — the warm-worker launcher, the compose cache for a sweep's jobs, and the
sweep's callbacks (parent run, results table, stopping workers)."""
