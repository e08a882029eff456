"""`trainbox doctor`: the launch context, preflight and CPU plan, as text or one JSON line;
with --network, a measurement of the job's network instead."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from trainbox import config
from trainbox.commands import flags
from trainbox.commands.command import Command
from trainbox.errors import PreflightError, UsageError
from trainbox.process import bootstrap, launching, provenance
from trainbox.version import __version__

if TYPE_CHECKING:
    from trainbox.network.probe import OwnNet, Result
    from trainbox.preflight.fabric import FabricFacts

NETWORK_OPTIONS = ("network_max_bytes", "network_min_fraction", "network_rated_gbps")


def main(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print what doctor found; exit 3 when preflight found something fatal."""
    if args.network:
        return network(args, env)
    given = [f"--{name.replace('_', '-')}" for name in NETWORK_OPTIONS if getattr(args, name)]
    if given:
        raise UsageError(
            f"{', '.join(given)} given without --network",
            hint="add --network to measure the network, or drop the option",
        )
    settings = config.load(args.config, args.overrides)
    prepared = launching.prepare(env, settings, whole_node=True)
    data = findings(prepared)
    # One line: several ranks printing to one stream (srun, mpirun) never split an object.
    print(json.dumps(data, separators=(",", ":")) if args.json else render(data))
    return preflight_exit(prepared)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--network",
        action="store_true",
        help="measure the job's network: all-reduce, all-gather and reduce-scatter sweeps and"
        " every node's ring links; exit 3 naming a slow node or link (docs/network-check.md)",
    )
    parser.add_argument(
        "--network-max-bytes",
        type=flags.byte_size,
        metavar="BYTES",
        help="largest buffer of the sweeps, e.g. 64M (default: 256M; at least 1K)",
    )
    parser.add_argument(
        "--network-min-fraction",
        type=flags.fraction,
        metavar="F",
        help="a link below F times the reference link is slow (default: 0.5)",
    )
    parser.add_argument(
        "--network-rated-gbps",
        type=flags.rate,
        metavar="GBPS",
        help="rated speed of each node's NIC in Gbit/s, instead of what sysfs says of the NICs"
        " NCCL uses; the reference link below F times it fails, even on one node",
    )
    flags.config_flag(parser)


COMMAND = Command(
    name="doctor", arguments=_arguments, handler=main, overrides=True,
    help="print the launch context, preflight and CPU plan",
)  # fmt: skip


def preflight_exit(prepared: bootstrap.StartupFacts) -> int:
    """Doctor's exit code: 3 when preflight found something fatal, as `run` would stop."""
    return PreflightError.exit_code if prepared.preflight.fatal else 0


def network(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Join the job's group as `run` does, sweep the collectives and time the ring's links on
    every rank; rank 0 prints the result. Exit 3 when a link or node is slow."""
    from trainbox.network import bandwidth, verdict  # pure, no torch

    settings = config.load(args.config, args.overrides)
    max_bytes = args.network_max_bytes or bandwidth.DEFAULT_MAX_BYTES
    min_fraction = args.network_min_fraction or verdict.DEFAULT_MIN_FRACTION
    prepared = launching.prepare(env, settings)
    # A node that fails preflight would fail the job anyway; its numbers would mislead.
    prepared.preflight.raise_if_fatal()
    rank = prepared.context.rank

    def work() -> int:
        from trainbox.network import probe, report  # torch loads only now, after pinning
        from trainbox.runtime import group

        with (
            nccl_log() as log_dir,
            group.joined(settings, prepared, work="the network check") as session,
        ):
            # The group is up and the peers agreed: NCCL has chosen its network by now.
            own = own_net(log_dir, prepared.fabric, rated=args.network_rated_gbps)
            result = probe.check(session, max_bytes=max_bytes, min_fraction=min_fraction, own=own)
        if rank != 0:
            # Every rank holds the same verdict; only rank 0 speaks.
            return 0 if result.ok else PreflightError.exit_code
        print(json.dumps(report.as_dict(result)) if args.json else report.render(result))
        return _network_exit(result)

    return launching.launch(
        prepared,
        env,
        argv=args.argv,
        extra={},
        # A measurement is not resumable work: a failed one is reported, not retried.
        max_restarts=0,
        deadline_at=None,
        work=work,
    )


@contextmanager
def nccl_log() -> Iterator[Path]:
    """NCCL's INFO lines about init and the network go to a file of this process's own, read
    back once the group is up (NCCL reads its variables when it starts, at the first
    collective). The folder is removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="trainbox-nccl-"))
    from trainbox.network import transport

    os.environ.update(transport.DEBUG_ENV)
    os.environ["NCCL_DEBUG_FILE"] = str(folder / "nccl.%p.log")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def own_net(folder: Path, fabric: FabricFacts | None, *, rated: float | None) -> OwnNet:
    """This rank's transport from its NCCL log in `folder`, and the rated speed of the NICs it
    uses (`rated` Gbit/s when given, else from the node's `fabric`)."""
    from trainbox.network import probe, transport
    from trainbox.preflight.fabric import FabricFacts

    lines = [
        line
        for path in sorted(folder.glob("nccl.*.log"))
        for line in path.read_text(errors="replace").splitlines()
    ]
    chosen = transport.parse(lines)
    known = transport.rated_gbps(chosen, fabric or FabricFacts())
    return probe.OwnNet(
        transport=chosen,
        rated_gbps=rated if rated is not None else known,
        rated_given=rated is not None,
        lines=tuple(transport.network_lines(lines)),
    )


def _network_exit(result: Result) -> int:
    from trainbox.network import transport, verdict

    if result.ok:
        return 0
    problems, hints = [], []
    if not result.verdict.ok:
        problems.append(f"network: {result.verdict.message}")
        hints.append(verdict.HINT)
    mixed = transport.mixed(result.transports)
    if mixed:
        problems.append(f"network: {mixed}")
        hints.append(transport.HINT_MIXED)
    if not result.floor.ok:
        using = transport.describe(result.transports)
        problems.append(f"network: {using}: {result.floor.message}")
        hints.append(transport.HINT)
    raise PreflightError(problems, hint=" / ".join(hints))


def findings(prepared: bootstrap.StartupFacts) -> dict[str, object]:
    """What doctor found, as one JSON-able object."""
    return {
        "trainbox": __version__,
        "host": socket.gethostname(),
        # Which lock and revision the image was built from (None outside an image).
        "image": dataclasses.asdict(provenance.read()),
        **prepared.context.describe(),
        **bootstrap.describe(prepared),
    }


def render(data: dict[str, object]) -> str:
    """The findings as aligned `key: value` lines for a person."""
    lines = []
    for key, value in data.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"{key}:")
            lines.extend(f"  - {_inline(item)}" for item in value)
        elif isinstance(value, dict):
            lines.append(f"{key}: {_inline(value)}")
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def _inline(item: dict[str, object]) -> str:
    return ", ".join(f"{key}={_short(value)}" for key, value in item.items())


def _short(value: object) -> str:
    if isinstance(value, list) and len(value) > 8:
        return f"[{len(value)} items: {value[0]}…{value[-1]}]"
    return str(value)
