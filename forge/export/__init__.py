"""Export: a run's kernels in a form that travels (forge export RUN --format hf-kernels DIR)."""
