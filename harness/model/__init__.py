"""Layer 3, model: what a workload is and what its ops cost — model cards and op formulas
(workload.py), the op arrays (ops.py), device cost (device.py), the ops.csv format (ops_csv.py)."""
