x = 1
raise RuntimeError("boom at import")
