"""Each preflight check is declared once (config/preflight_checks.py): judge() emits exactly the
declared checks, preflight.fatal accepts and defaults to them, and the report reads them."""

from __future__ import annotations

import pytest

from trainbox import config
from trainbox.config.preflight_checks import CHECK_NAMES, CHECKS, FATAL_CHECKS
from trainbox.errors import TrainboxError
from trainbox.preflight import Check, Expectations, NodeFacts, Report, judge
from trainbox.preflight.fabric import FabricFacts
from trainbox.preflight.facts import GpuFacts, GpuSurvey

# A node on which every check runs: a driver and a GPU, an s3:// run_dir probed, the fabric read.
SURVEY = GpuSurvey(
    driver_version="570.124.06", cuda_driver=(12, 8), gpus=(GpuFacts(index=0, uuid="GPU-0"),)
)
NODE = NodeFacts(
    torch_cuda=(12, 8), shm_mib=65536, run_dir_problem=None, disk_free_mib=100_000,
    master_problem=None, fabric=FabricFacts(), store_url="s3://runs/exp1", store_probed=True,
)  # fmt: skip
WANT = Expectations(
    gpus="auto", gpus_needed=1, own_gpu=0, world_size=2, num_workers=0, local_world_size=1,
    shm_mib_per_worker=256, min_free_disk_mib=1024, other_process_share=0.1,
)  # fmt: skip


def test_judge_emits_every_declared_check_in_the_declared_order() -> None:
    assert tuple(check.name for check in judge(SURVEY, NODE, WANT)) == CHECK_NAMES


def test_each_check_is_declared_once() -> None:
    assert len(set(CHECK_NAMES)) == len(CHECKS)


def test_preflight_fatal_defaults_to_the_checks_declared_fatal() -> None:
    assert config.load(None, []).preflight.fatal == [c.name for c in CHECKS if c.fatal]
    assert "fabric" not in FATAL_CHECKS


@pytest.mark.parametrize(
    ("listed", "words"),
    [
        ("[ecc,fabric]", None),
        ("[ec]", "preflight.fatal names an unknown check 'ec' (did you mean 'ecc'?)"),
        ("[bogus]", "preflight.fatal names an unknown check 'bogus'"),
    ],
)
def test_preflight_fatal_accepts_only_declared_checks(listed: str, words: str | None) -> None:
    if words is None:
        assert config.load(None, [f"preflight.fatal={listed}"]).preflight.fatal == ["ecc", "fabric"]
        return
    with pytest.raises(config.ConfigError) as caught:
        config.load(None, [f"preflight.fatal={listed}"])
    assert words in caught.value.problems


@pytest.mark.parametrize(
    ("failing", "exit_code"),
    [(("run_dir",), 2), (("run_dir", "shm"), 3), (("storage",), 3)],
)
def test_only_a_failure_of_the_users_own_setting_exits_2(
    failing: tuple[str, ...], exit_code: int
) -> None:
    checks = tuple(Check(name=name, status="fail", message="bad") for name in failing)
    report = Report(checks=checks, fatal_names=frozenset(FATAL_CHECKS))
    with pytest.raises(TrainboxError) as caught:
        report.raise_if_fatal()
    assert caught.value.exit_code == exit_code
