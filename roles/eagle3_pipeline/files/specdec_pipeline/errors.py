"""The one exception type the CLI turns into a single clear line."""


class PipelineError(Exception):
    """Bad input or a failed check: the message names the file, what was expected and what to do."""


class StopAfter(Exception):  # noqa: N818 - a planned stop, not an error
    """The run stops on purpose (e.g. no training possible on this machine); the message says why."""
