"""Every `trainbox` command, in the order `trainbox --help` lists them: a new command's module
declares its COMMAND and is named here once."""

from __future__ import annotations

from trainbox.commands import config, doctor, eval, exec, export, hang, predict, report, run
from trainbox.commands.command import Command

COMMANDS: tuple[Command, ...] = (
    run.COMMAND,
    eval.COMMAND,
    predict.COMMAND,
    export.COMMAND,
    doctor.COMMAND,
    config.COMMAND,
    exec.COMMAND,
    report.COMMAND,
    hang.COMMAND,
)
