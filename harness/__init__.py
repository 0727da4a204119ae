"""hostbound: simulate how LLM inference is scheduled between a host CPU and an accelerator.

Compose a hardware model, a workload and a scheduling strategy (Hydra), run a deterministic
discrete-event simulation of host threads, queues, device streams and AI cores (Numba), and report
throughput, latency and device-bubble metrics (files + MLflow).
"""

__version__ = "0.1.0"
