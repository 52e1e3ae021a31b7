"""The benchmark scripts' ``main`` turns the model-entry input checks off for the process: restore them after each
test, so that the tests of other folders run with the library's default whatever order pytest takes."""

from __future__ import annotations

import pytest

from primaldual.checks import input_checks_enabled, set_input_checks


@pytest.fixture(autouse=True)
def _restore_input_checks():
    enabled = input_checks_enabled()
    yield
    set_input_checks(enabled)
