"""RNG capture: what a checkpoint records of NumPy's global generator."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

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


def draws() -> tuple[list[float], list[float], float]:
    """One draw from each generator a step may use: torch's, NumPy's and Python's."""
    return torch.rand(3).tolist(), np.random.random(3).tolist(), random.random()


@pytest.fixture
def rng_kept() -> Iterator[None]:
    """Put the process's RNG states back after a test that reseeds them."""
    state = determinism.capture_rng()
    yield
    determinism.restore_rng(state)


@pytest.mark.usefixtures("rng_kept")
def test_a_steps_stream_is_rebuilt_from_the_step_alone() -> None:
    # What lets a spare that took a rank over draw what the lost process would have drawn.
    cpu = torch.device("cpu")
    determinism.seed_step(5, 2, 17, cpu)
    first = draws()
    determinism.seed_step(5, 2, 18, cpu)
    draws()
    determinism.seed_step(5, 2, 17, cpu)
    assert draws() == first


@pytest.mark.usefixtures("rng_kept")
@pytest.mark.parametrize(
    "other", [(5, 2, 18), (5, 3, 17), (6, 2, 17)], ids=["next-step", "next-rank", "other-seed"]
)
def test_every_seed_rank_and_step_has_its_own_stream(other: tuple[int, int, int]) -> None:
    cpu = torch.device("cpu")
    determinism.seed_step(5, 2, 17, cpu)
    first = draws()
    determinism.seed_step(*other, cpu)
    assert draws()[0] != first[0]


def test_step_seeds_do_not_collide_over_many_ranks_and_steps() -> None:
    seeds = {determinism.step_seed(0, rank, step) for rank in range(64) for step in range(2000)}
    assert len(seeds) == 64 * 2000
