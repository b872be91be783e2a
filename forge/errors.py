"""Errors forge raises for bad input: the CLI prints them as one line and exits with code 2."""


class UserError(Exception):
    """Bad input from the user (a file, an option, a model): one line saying what is wrong and the fix."""


class StoreUnavailable(UserError):
    """The run store asked for cannot be opened (a server that does not answer, a file that is no database, a
    folder that cannot be made, a driver that is not installed)."""


class RunFailed(Exception):
    """A run that cannot go on (its LLM key holder is gone): one line, stored with the run; the CLI exits 1."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run that can be continued: `resume` is what continues it (forge optimize --resume RUN)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id
