"""train.strategy=fsdp and hsdp: what they cannot be combined with is refused when the config
loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainbox import config
from trainbox.checkpoint import shards
from trainbox.config import ConfigError
from trainbox.infer import locate
from trainbox.train.resume import policy

from runs import clean_env

REFUSED = [
    ("train.find_unused_parameters=true", "train.find_unused_parameters=true"),
]
# hsdp is fsdp on a 2-D mesh: it refuses what fsdp refuses.
SHARDED = ["fsdp", "hsdp"]


@pytest.mark.parametrize("strategy", SHARDED)
@pytest.mark.parametrize(("override", "named"), REFUSED)
def test_a_setting_fsdp_cannot_run_with_is_refused_naming_the_key(
    override: str, named: str, strategy: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        config.load(None, [f"train.strategy={strategy}", override])
    [problem] = caught.value.problems
    assert problem.startswith(f"{named} is not supported with train.strategy={strategy} (")
    assert "train.strategy=ddp" in caught.value.hint
    assert "docs/fsdp.md#refused-under-fsdp" in caught.value.hint


def test_every_refused_setting_is_named_in_one_error() -> None:
    overrides = [override for override, _ in REFUSED]
    with pytest.raises(ConfigError) as caught:
        config.load(None, ["train.strategy=fsdp", *overrides])
    assert [problem.split(" is not")[0] for problem in caught.value.problems] == [
        named for _, named in REFUSED
    ]
    assert "HINT: " in caught.value.line()


@pytest.mark.parametrize("strategy", SHARDED)
def test_in_process_recovery_is_refused_under_fsdp(strategy: str) -> None:
    # A dead rank's shards are gone with it: only its checkpoint holds them.
    with pytest.raises(ConfigError) as caught:
        config.load(None, [f"train.strategy={strategy}", "dist.recovery=in_process"])
    [problem] = caught.value.problems
    assert problem.startswith(
        f"dist.recovery=in_process is not supported with train.strategy={strategy}"
    )
    assert "dist.recovery=restart" in caught.value.hint
    assert "docs/reliability.md#in-process-recovery" in caught.value.hint


def test_fsdp_and_recovery_refusals_come_in_one_error() -> None:
    overrides = ["train.strategy=fsdp", "dist.recovery=in_process", *(o for o, _ in REFUSED)]
    with pytest.raises(ConfigError) as caught:
        config.load(None, overrides)
    assert len(caught.value.problems) == len(REFUSED) + 1
    assert "train.strategy=ddp" in caught.value.hint
    assert "dist.recovery=restart" in caught.value.hint


def test_ddp_takes_in_process_recovery() -> None:
    assert config.load(None, ["dist.recovery=in_process"]).dist.recovery == "in_process"


@pytest.mark.parametrize(("override", "named"), REFUSED)
def test_ddp_takes_the_same_settings(override: str, named: str) -> None:
    del named
    assert config.load(None, [override]).train.strategy == "ddp"


@pytest.mark.parametrize(
    "override",
    ["train.init_from=runs/old", "train.state_factory=pkg.mod:ema", "train.async_save=true"],
)
def test_fsdp_takes_the_state_side_settings(override: str) -> None:
    assert config.load(None, ["train.strategy=fsdp", override]).train.strategy == "fsdp"


def test_fsdp_with_defaults_and_bf16_loads() -> None:
    loaded = config.load(None, ["train.strategy=fsdp", "train.amp=bf16", "train.grad_accum=2"])
    assert (loaded.train.strategy, loaded.train.fsdp_units) == ("fsdp", "")


def test_fsdp_takes_compile_fp16_checkpointing_and_the_reshard_switch() -> None:
    loaded = config.load(None, ["train.strategy=fsdp", "train.compile=true", "train.amp=fp16",
                                "train.activation_checkpointing=true",
                                "train.fsdp_reshard_after_forward=false"]).train  # fmt: skip
    assert (loaded.compile, loaded.amp, loaded.activation_checkpointing) == (True, "fp16", True)
    assert loaded.fsdp_reshard_after_forward is False


def test_a_resumed_run_may_change_how_blocks_are_run() -> None:
    assert policy.rule_for("train.fsdp_reshard_after_forward")[0] is True
    assert policy.rule_for("train.activation_checkpointing")[0] is True


def test_an_unknown_strategy_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"train.strategy"):
        config.load(None, ["train.strategy=zero3"])


def test_the_units_seam_must_name_a_function() -> None:
    with pytest.raises(ConfigError, match=r"train.fsdp_units"):
        config.load(None, ["train.strategy=fsdp", "train.fsdp_units=not a path"])


def test_a_resumed_run_may_change_the_units_but_not_the_strategy() -> None:
    assert policy.rule_for("train.fsdp_units")[0] is True
    assert policy.rule_for("train.strategy")[0] is False


def test_trainbox_run_refuses_before_writing_and_exits_2(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "trainbox", "run", f"run_dir={run_dir}", "train.strategy=fsdp",
         "train.find_unused_parameters=true"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith(
        "trainbox: error: train.find_unused_parameters=true is not supported with"
    )
    assert " HINT: " in line
    assert not run_dir.exists()


def sharded_checkpoint(run_dir: Path) -> Path:
    """A run_dir whose latest checkpoint is a sharded folder with a manifest that lists nothing."""
    folder = run_dir / "checkpoints" / "step-00000004.dcp"
    folder.mkdir(parents=True)
    (folder / shards.MANIFEST).write_text("{}")
    (run_dir / "checkpoints" / "latest").symlink_to(folder.name)
    return folder


@pytest.mark.parametrize("command", ["eval", "predict"])
def test_eval_and_predict_check_a_sharded_checkpoint_before_reading_it(
    tmp_path: Path, command: str
) -> None:
    sharded_checkpoint(tmp_path)
    assert locate.checkpoint_problem(locate.checkpoint_path(str(tmp_path))) is None
    output = ["--output", str(tmp_path / "p.csv")] if command == "predict" else []
    proc = subprocess.run(
        [sys.executable, "-m", "trainbox", command, "--checkpoint", str(tmp_path), *output],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("trainbox: error")]
    assert "step-00000004.dcp/manifest.json does not list the checkpoint's files" in line
    assert " HINT: " in line


def test_locate_knows_the_manifest_by_the_name_shards_write() -> None:
    # locate.py cannot import checkpoint/shards.py (torch) before the CPUs are pinned.
    assert locate.SHARDED_MANIFEST == shards.MANIFEST
