"""Capture: a model (a KernelBench file or a zoo model) loaded, exported to an ATen graph with real shapes, put
in the layout it runs faster in, and every node timed (the profile the search starts from)."""
