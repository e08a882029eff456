"""Bad nodes: which host failed a job attempt and why, one small file per event in run_dir.

Layout: run_dir/bad_nodes/ATTEMPT/HOST/rank-R.json, ATTEMPT being `JOBID.RESTARTS` under Slurm
(`local` elsewhere). The sbatch scripts read the HOST folder names of their own attempt with
`find` alone: the host running the batch shell need not have Python.
"""

from __future__ import annotations

import json
import platform
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from trainbox import atomic
from trainbox.errors import StorageError
from trainbox.logs import log
from trainbox.storage import mirror

FOLDER = "bad_nodes"
# What made the node bad, as the record and the sbatch scripts' message say it.
GPU_FAULT, PREFLIGHT, RANKS_DIED = "gpu fault", "preflight", "ranks died"
REASONS = (GPU_FAULT, PREFLIGHT, RANKS_DIED)
# Set from the pod's spec.nodeName through the downward API (k8s/*.yaml): a pod's own host
# name is the pod's, and `kubectl cordon` needs the node's.
NODE_NAME_ENV = "TRAINBOX_NODE_NAME"
# LaunchContext.flavor of the Kubeflow operators' pods (launch/kubeflow.py).
KUBEFLOW_FLAVORS = frozenset({"pytorchjob", "trainjob"})
# Each field of a record's JSON and the types it may hold (a bool is no int here).
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "host": str, "reason": str, "detail": str, "exit_code": int, "rank": int, "job_id": str,
    "restart_count": (int, type(None)), "time": (int, float),
    "workers_restart": (int, type(None)),
}  # fmt: skip
# A host name as Slurm and Kubernetes spell them; anything else would make a bad folder name.
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


@dataclass(frozen=True, kw_only=True, slots=True)
class BadNode:
    """One event that made a node bad for the job."""

    # The node: Slurm's node name, Kubernetes' node name, else the host name.
    host: str
    # One of REASONS.
    reason: str
    # The error's one line.
    detail: str
    # The exit code the job ends with for it (3 or 4).
    exit_code: int
    # The rank that wrote this record.
    rank: int
    # SLURM_JOB_ID ("" outside Slurm).
    job_id: str
    # SLURM_RESTART_COUNT (None when Slurm does not set it: the job's first run).
    restart_count: int | None
    # Epoch seconds when it was recorded.
    time: float
    # torchrun's TORCHELASTIC_RESTART_COUNT in node mode (None elsewhere): each in-job restart
    # of the same Slurm attempt gets its own file.
    workers_restart: int | None = None


def node_name(env: Mapping[str, str]) -> str:
    """The name a scheduler knows this node by: what an exclude list or a cordon takes."""
    return env.get("SLURMD_NODENAME") or env.get(NODE_NAME_ENV) or platform.node()


def attempt(env: Mapping[str, str]) -> str:
    """This job attempt's folder name: `JOBID.RESTARTS` under Slurm, else `local`."""
    return _attempt_folder(env.get("SLURM_JOB_ID", ""), _restarts(env))


def _attempt_folder(job_id: str, restart_count: int | None) -> str:
    """`JOBID.RESTARTS` under Slurm (a first run counts 0), else `local`."""
    return f"{job_id}.{restart_count or 0}" if job_id else "local"


def _restarts(env: Mapping[str, str]) -> int | None:
    """SLURM_RESTART_COUNT, or None where Slurm does not set it (a job's first run)."""
    return _count(env, "SLURM_RESTART_COUNT")


def _count(env: Mapping[str, str], name: str) -> int | None:
    """A count the launcher sets in `name`; None when unset or not a number."""
    value = env.get(name, "")
    return int(value) if value.isdigit() else None


def event(
    env: Mapping[str, str], *, reason: str, detail: str, exit_code: int, rank: int,
    now: float, host: str | None = None,
) -> BadNode:  # fmt: skip
    """The record of `reason` on `host` (default: this node), from the job's environment."""
    return BadNode(
        host=host or node_name(env),
        reason=reason,
        detail=detail,
        exit_code=exit_code,
        rank=rank,
        job_id=env.get("SLURM_JOB_ID", ""),
        restart_count=_restarts(env),
        time=round(now, 3),
        workers_restart=_count(env, "TORCHELASTIC_RESTART_COUNT"),
    )


def cordon_hint(host: str, env: Mapping[str, str], *, flavor: str) -> str:
    """Under Kubeflow, what to add to an exit-3/4 HINT: the node to cordon ("" elsewhere)."""
    if flavor not in KUBEFLOW_FLAVORS:
        return ""
    # Without the downward API's variable a host name is a pod's, which kubectl cordon rejects.
    if not env.get(NODE_NAME_ENV) or not _HOST.match(host):
        return (
            f"; on Kubernetes, set {NODE_NAME_ENV} from spec.nodeName (k8s/README.md) to be"
            " told which node to cordon"
        )
    return (
        f"; on Kubernetes, `kubectl cordon {host}` keeps the pods the operator recreates off"
        f" node {host} (it restarts pods by exit code and never avoids a node)"
    )


def path_for(run_dir: Path, record: BadNode) -> Path:
    """Where `record` lives: one file per writing rank, under its attempt and host."""
    folder = _attempt_folder(record.job_id, record.restart_count)
    again = "" if record.workers_restart is None else f"-restart-{record.workers_restart}"
    return run_dir / FOLDER / folder / record.host / f"rank-{record.rank}{again}.json"


def parse(text: str) -> BadNode:
    """A record from its file's text; ValueError naming every problem."""
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON: {err}") from err
    if not isinstance(fields, dict):
        raise ValueError("not a JSON object")
    problems = [f"{key} missing" for key in _FIELD_TYPES if key not in fields]
    problems += [
        f"{key} is {type(fields[key]).__name__}"
        for key, kind in _FIELD_TYPES.items()
        if key in fields and (not isinstance(fields[key], kind) or isinstance(fields[key], bool))
    ]
    if not problems and fields["reason"] not in REASONS:
        problems.append(f"reason {fields['reason']!r} is none of {', '.join(REASONS)}")
    if not problems and not _HOST.match(fields["host"]):
        problems.append(f"host {fields['host']!r} is not a node name")
    if problems:
        raise ValueError("; ".join(problems))
    return BadNode(**{key: fields[key] for key in _FIELD_TYPES})


def bad_hosts(records: Iterable[BadNode], *, job_id: str, restart_count: int | None) -> list[str]:
    """The hosts recorded bad in one job attempt, sorted, each once."""
    return sorted(
        {
            r.host
            for r in records
            if r.job_id == job_id and (r.restart_count or 0) == (restart_count or 0)
        }
    )


def dead_ranks_recorder(blamed: int) -> int:
    """The one rank that records a dead rank's node: the lowest rank not blamed."""
    return 1 if blamed == 0 else 0


def write(run_dir: Path | None, record: BadNode) -> Path | None:
    """Say which node failed and why (one line), and record it atomically in run_dir.

    A failed write is logged, never raised: the exit must happen. In node mode the line
    carries torchrun's restart count, so each in-job restart's cause is named once.
    """
    path = None if run_dir is None or not _HOST.match(record.host) else path_for(run_dir, record)
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_text(path, json.dumps(asdict(record), sort_keys=True) + "\n")
        except OSError as err:
            log.warning("bad node not recorded", host=record.host, error=str(err))
            path = None
    if path is not None:
        # run_dir=s3://: the record goes to the store now, since this process is on its way out.
        try:
            mirror.push_if_stored(path)
        except StorageError as err:
            log.warning("bad node record not uploaded", host=record.host, error=err.line())
    restart = record.workers_restart
    log.error(
        "bad node",
        host=record.host,
        reason=record.reason,
        detail=record.detail,
        **({"workers_restart": restart} if restart is not None else {}),
        recorded=str(path) if path else None,
    )
    return path


def read(run_dir: Path) -> list[BadNode]:
    """Every readable record under run_dir (a damaged file is skipped with a warning)."""
    found = []
    for path in sorted((run_dir / FOLDER).glob("*/*/rank-*.json")):
        try:
            found.append(parse(path.read_text()))
        except (OSError, ValueError) as err:
            log.warning("bad node record unreadable", path=str(path), error=str(err))
    return found
