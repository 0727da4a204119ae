"""Layer 6, tracking: every MLflow call — logging a run folder, the store and its experiment, reading
runs back. `python -m harness.tracking log RUN_DIR …` logs folders afterwards."""
