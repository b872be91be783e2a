"""Tasks: the captured graph cut into heavy ops and fusible regions, each rendered as the source of a function
that a kernel must compute (the unit the search, the evaluation and the dispatch share)."""
