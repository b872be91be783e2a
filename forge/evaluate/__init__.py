"""Evaluation: candidates checked, built, run in sandboxed worker processes (`child`) started by `parent`, and
judged in forge's own process (`judge`, `verify`) against the reference, with a clock they cannot reach."""
