"""Layer 5, results: what a run leaves behind and how runs are compared — the run folder's files
(outputs.py), the timeline picture, resuming a finished run, the comparison table and plots."""
