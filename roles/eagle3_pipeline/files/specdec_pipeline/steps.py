"""The shared steps, for the tracks' STEPS tables: each function returns the step's module (imported then)."""


def regenerate():
    from specdec_pipeline import regenerate as module  # noqa: PLC0415 - imported by the step that runs it

    return module


def prepare():
    from specdec_pipeline import prepare as module  # noqa: PLC0415 - imported by the step that runs it

    return module


def vocab():
    from specdec_pipeline import vocab as module  # noqa: PLC0415

    return module
