"""Fixtures more than one tier uses, registered for every test by tests/conftest.py (`pytest_plugins`). Each imports
what it needs when it runs, so a session that uses none of them imports neither Flower nor torch for them."""

from __future__ import annotations

import pytest


@pytest.fixture
def pull_defaults():
    """Flower's object-pull keyword defaults, restored after the test."""
    from flwr.supercore.inflatable import inflatable_utils

    functions = (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree)
    saved = [dict(function.__kwdefaults__) for function in functions]
    yield functions
    for function, defaults in zip(functions, saved):
        function.__kwdefaults__.clear()
        function.__kwdefaults__.update(defaults)


@pytest.fixture
def grid_pulls(monkeypatch):
    """Flower's HttpGrid module with its own `pull_objects`, restored after the test."""
    from flwr.superlink.grid import http_grid

    monkeypatch.setattr(http_grid, "pull_objects", http_grid.pull_objects)
    return http_grid


@pytest.fixture
def trained(tmp_path):
    """Two rounds of the 3-client BayesADMM federation of tests/support/forgetting.py, stopped."""
    from tests.support.forgetting import Federation

    federation = Federation(tmp_path)
    federation.run(2)
    return federation
