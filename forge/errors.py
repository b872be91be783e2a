"""Errors forge raises for bad input: the CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """Bad input from the user (a file, an option, a model): one line saying what is wrong and the fix."""
