"""Run each real launcher over tests/envdump.py and record what it puts in the environment.

Refresh the unit-test fixtures in tests/unit/envs/ (as root, with Slurm and Open MPI installed):

    .venv/bin/python tests/launchers/capture.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from freeport import free_port  # noqa: E402
from launchers.slurm_cluster import SlurmCluster, start_cluster  # noqa: E402

DUMP = TESTS / "envdump.py"
FIXTURES = TESTS / "unit" / "envs"
PYTHON = sys.executable
RANK_NAMES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")


@dataclass(frozen=True, kw_only=True)
class Case:
    """One launcher invocation whose processes' environments we record."""

    # Fixture file stem.
    name: str
    # What ran, in words a user would type.
    command: str
    # Runs the launcher so that every process dumps into the given directory.
    run: Callable[[Path, SlurmCluster | None], None]
    # Whether it needs the local Slurm cluster.
    needs_slurm: bool = False


def _local(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120)


def _in_cluster(cluster: SlurmCluster | None, argv: list[str]) -> None:
    assert cluster is not None
    proc = cluster.run(argv, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} failed: {proc.stdout}{proc.stderr}")


def _batch(cluster: SlurmCluster | None, body: str, out: Path) -> None:
    assert cluster is not None
    script = out.parent / f"{out.name}.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH -N2 --ntasks-per-node=2\nset -e\n{body}\n")
    job = cluster.sbatch(script, args=[f"--output={out.parent / (out.name + '.log')}"])
    state = cluster.wait_job(job, timeout=120)
    if state != "COMPLETED":
        raise RuntimeError(f"job {job} ended {state}: {cluster.diagnostics(job)}")


def _srun_case(name: str, *options: str) -> Case:
    return Case(
        name=name,
        command=" ".join(("srun", *options)),
        run=lambda out, c: _in_cluster(c, ["srun", *options, PYTHON, str(DUMP), str(out)]),
        needs_slurm=True,
    )


def _torchrun_in_srun(out: Path, cluster: SlurmCluster | None, *options: str) -> None:
    agent = (
        f"exec {PYTHON} -m torch.distributed.run --nnodes=2 --node-rank=$SLURM_NODEID"
        f" --nproc-per-node=2 --master-addr=n1 --master-port={free_port()} {' '.join(options)}"
        f" {DUMP} {out}"
    )
    _in_cluster(cluster, ["srun", "-N2", "--ntasks-per-node=1", "sh", "-c", agent])


CASES = (
    Case(
        name="torchrun_nproc2",
        command="torchrun --standalone --nproc-per-node 2",
        run=lambda out, _: _local(
            [
                PYTHON,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node=2",
                str(DUMP),
                str(out),
            ]
        ),
    ),
    Case(
        name="mpirun_np2",
        command="mpirun -np 2 (Open MPI)",
        run=lambda out, _: _local(
            [
                "mpirun",
                "--allow-run-as-root",
                "--oversubscribe",
                "-np",
                "2",
                PYTHON,
                str(DUMP),
                str(out),
            ]
        ),
    ),
    _srun_case("srun_N2_tpn2", "-N2", "--ntasks-per-node=2"),
    _srun_case("srun_N2_tpn1", "-N2", "--ntasks-per-node=1"),
    _srun_case("srun_pmi2", "-N1", "-n2", "--mpi=pmi2"),
    Case(
        name="sbatch_shell",
        command="sbatch -N2 --ntasks-per-node=2, python run directly in the batch script",
        run=lambda out, c: _batch(c, f"{PYTHON} {DUMP} {out}", out),
        needs_slurm=True,
    ),
    Case(
        name="mpirun_in_sbatch",
        command="sbatch -N2 --ntasks-per-node=2 running mpirun -np 4 (Open MPI)",
        run=lambda out, c: _batch(
            c,
            "mpirun --allow-run-as-root --oversubscribe -np 4 -x MASTER_ADDR=n1"
            f" {PYTHON} {DUMP} {out}",
            out,
        ),
        needs_slurm=True,
    ),
    Case(
        name="torchrun_in_srun",
        command="srun -N2 --ntasks-per-node=1 torchrun --nnodes 2 --nproc-per-node 2",
        run=_torchrun_in_srun,
        needs_slurm=True,
    ),
    # Every worker gets LOCAL_RANK=0 (and one GPU in CUDA_VISIBLE_DEVICES).
    Case(
        name="torchrun_virtual_local_rank",
        command="srun -N2 --ntasks-per-node=1 torchrun --nnodes 2 --nproc-per-node 2"
        " --virtual-local-rank",
        run=lambda out, c: _torchrun_in_srun(out, c, "--virtual-local-rank"),
        needs_slurm=True,
    ),
)


def capture(case: Case, workdir: Path, cluster: SlurmCluster | None) -> list[dict[str, str]]:
    """Run `case` and return every process's launcher variables, in rank order."""
    out = workdir / case.name
    case.run(out, cluster)
    processes = [json.loads(path.read_text()) for path in out.glob("*.json")]
    return sorted(processes, key=_rank_key)


def _rank_key(env: dict[str, str]) -> tuple[int, ...]:
    return tuple(int(env[name]) if env.get(name, "").isdigit() else -1 for name in RANK_NAMES)


def _versions() -> dict[str, str]:
    def first_line(argv: list[str]) -> str:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        return (proc.stdout or proc.stderr).strip().splitlines()[0]

    import torch

    return {
        "slurm": first_line(["srun", "--version"]),
        "mpirun": first_line(["mpirun", "--version"]),
        "torch": torch.__version__,
    }


def main() -> None:
    """Capture every case into tests/unit/envs/<name>.json."""
    versions = _versions()
    with (
        tempfile.TemporaryDirectory(prefix="tbcap") as tmp,
        start_cluster(Path(tmp) / "slurm", python_bin_dir=Path(PYTHON).parent) as cluster,
    ):
        for case in CASES:
            processes = capture(case, Path(tmp), cluster)
            fixture = {
                "command": case.command,
                "captured": datetime.now(UTC).strftime("%Y-%m-%d"),
                "versions": versions,
                "processes": processes,
            }
            (FIXTURES / f"{case.name}.json").write_text(json.dumps(fixture, indent=1) + "\n")
            print(f"{case.name}: {len(processes)} processes")


if __name__ == "__main__":
    main()
