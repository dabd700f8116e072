"""Tests CI leaves out for its time: each runs when its variable is 1 and otherwise skips in one line saying why
and how to run it (docs/testing.md, "Choosing checks")."""

import os

import pytest


def opt_in(variable, why):
    """A skip marker: the test runs only with VARIABLE=1; WHY says what leaving it out saves or where it is covered."""
    return pytest.mark.skipif(os.environ.get(variable) != "1", reason=f"{why}: runs with {variable}=1")
