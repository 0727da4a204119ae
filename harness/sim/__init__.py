"""Layer 4, sim: a RunConfig → a simulated run. Policies decide each step's graph mode and cache hits,
lowering turns ops into a task graph, the Numba kernel runs it, metrics and serving summarise it;
simulate.py drives them in that order."""
