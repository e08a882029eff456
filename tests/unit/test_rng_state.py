"""RNG capture: what a checkpoint records of NumPy's global generator."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from trainbox.errors import UsageError
from trainbox.train.resume import determinism


@pytest.fixture
def pcg64_global_generator() -> Iterator[None]:
    before = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(7))
    yield
    np.random.set_bit_generator(before)


def test_capture_then_restore_replays_numpy_draws() -> None:
    np.random.seed(3)
    state = determinism.capture_rng()
    first = np.random.random(4)
    determinism.restore_rng(state)
    assert np.array_equal(np.random.random(4), first)


@pytest.mark.usefixtures("pcg64_global_generator")
@pytest.mark.filterwarnings("ignore:get_state and legacy:RuntimeWarning")
def test_capture_names_a_replaced_numpy_bit_generator() -> None:
    # Only MT19937 has the legacy state a checkpoint records; any other is a one-line error.
    with pytest.raises(UsageError, match="PCG64"):
        determinism.capture_rng()
