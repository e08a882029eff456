"""The run configuration: its schema (schema.py) and its loading from YAML and overrides
(loading.py). Precedence, lowest to highest: the defaults < `--config FILE` < `key.sub=value`.
"""

from __future__ import annotations

from trainbox.config.loading import (
    HINT,
    NAME_HINT,
    NAME_MAX_BYTES,
    SOURCES,
    ConfigError,
    Resolved,
    as_dict,
    fingerprint,
    leaves,
    load,
    name_problems,
    parse_yaml,
    reference_markdown,
    resolve,
    to_yaml,
)
from trainbox.config.preflight_checks import CHECK_NAMES, FATAL_CHECKS
from trainbox.config.schema import (
    Config,
    DataConfig,
    DistConfig,
    HealthConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    PinningConfig,
    PreflightConfig,
    TrainConfig,
)

__all__ = [
    "CHECK_NAMES",
    "FATAL_CHECKS",
    "HINT",
    "NAME_HINT",
    "NAME_MAX_BYTES",
    "SOURCES",
    "Config",
    "ConfigError",
    "DataConfig",
    "DistConfig",
    "HealthConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimConfig",
    "PinningConfig",
    "PreflightConfig",
    "Resolved",
    "TrainConfig",
    "as_dict",
    "fingerprint",
    "leaves",
    "load",
    "name_problems",
    "parse_yaml",
    "reference_markdown",
    "resolve",
    "to_yaml",
]
