"""Search: a Monte Carlo Tree Search per task over the candidates a policy proposes, driven under a wall-time
budget, its rows recorded through a Recorder (forge.store implements it; the search imports no store)."""
