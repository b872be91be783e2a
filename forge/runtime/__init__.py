"""Runtime: the winners dispatched into the user's model behind guards, whole-graph rewrites, the variants
measured end to end (CUDA graphs, Inductor), and artifacts that `forge.load` rebuilds."""
