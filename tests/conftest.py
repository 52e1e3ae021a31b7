"""Shared test helpers."""

from __future__ import annotations

import pytest
import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / max(||b||, 1e-8): the relative error used by every reference comparison."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-8))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_configure(config):
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
