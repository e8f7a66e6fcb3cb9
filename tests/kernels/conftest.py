"""Every kernel test starts with an empty plan history (kernels/plan_history.py): a dense plan in one test must not
make a later test of the same head shape skip its planning."""

from __future__ import annotations

import pytest

from kernels.plan_history import HISTORY


@pytest.fixture(autouse=True)
def _fresh_plan_history() -> None:
    HISTORY.clear()
