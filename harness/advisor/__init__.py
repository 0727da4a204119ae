"""python -m harness.advise: the best configuration under the user's limits (candidates, search, answer)."""
