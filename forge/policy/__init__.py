"""Policies: what proposes candidate kernels to the search (the Policy base class; the offline recipe
generator in `recipes/`; language models in `llm/`)."""
