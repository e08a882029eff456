"""Loading the run configuration: defaults < `--config FILE` < `key.sub=value` arguments, checked
strictly against the schema (trainbox/config/schema.py), every problem reported at once.

Environment variables are facts from the launcher, never configuration.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import math
import re
import reprlib
import shlex
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from yaml.events import AliasEvent

from trainbox.config.preflight_checks import CHECK_NAMES
from trainbox.config.schema import Config
from trainbox.config.strategy import FSDP_HINT, RECOVERY_HINT, fsdp_problems, recovery_problems
from trainbox.errors import UsageError
from trainbox.storage import location

HINT = (
    "see the configuration reference in docs/configuration.md; "
    "override keys as `train.max_steps=200`"
)
FACTORY_PATTERN = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
# Keys naming user code as `module:function`; those whose default is empty may stay empty.
CALLABLE_FIELDS = frozenset(
    {
        "factory",
        "step",
        "schedule_factory",
        "state_factory",
        "eval_step",
        "predict_step",
        "fsdp_units",
    }
)
# Marks a field whose value failed its check; the field then keeps its default.
_INVALID: Any = object()
# Every rank reads the config before any watchdog exists, so a file must not be able to hang or
# crash it: an alias used many times (an "alias bomb") expands to gigabytes, and deep nesting
# overflows the parser's recursion. Real configs are a few hundred values a few levels deep.
# Levels count from the top of the file (`model.args.x` is 3 deep); values count every key, item
# and nested list or mapping, an alias as often as it is used.
MAX_DEPTH = 100
MAX_VALUES = 100_000
# Values quoted in a problem stay short: the problem is one line that names its key.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict = 3, 6, 6
_SHOWN.maxstring = _SHOWN.maxother = _SHOWN.maxlong = 80


class ConfigError(UsageError):
    """The configuration file or an override is missing, malformed, mistyped or unknown."""


# A run name is one folder under runs/; 128 bytes leaves room below any file system's limit.
NAME_MAX_BYTES = 128
NAME_HINT = "name the run with one folder name such as `name=lr-0.1`; use run_dir=PATH for a path"
RUN_DIR_HINT = location.URL_HINT
# Where a value came from, lowest precedence first.
SOURCES = ("default", "file", "override")


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """A checked config and where each value that is not a default came from."""

    # The configuration, checked.
    config: Config
    # Dotted key (a field, or an entry of a `*.args` mapping) -> "file" or "override".
    sources: Mapping[str, str]

    def source(self, key: str) -> str:
        """`default`, `file` or `override`: the source of `key` or of the mapping holding it."""
        parts = key.split(".")
        for end in range(len(parts), 0, -1):
            found = self.sources.get(".".join(parts[:end]))
            if found is not None:
                return found
        return "default"


def load(path: str | None, overrides: Sequence[str]) -> Config:
    """The config from defaults, an optional YAML file and dotted overrides; all errors at once."""
    return resolve(path, overrides).config


def resolve(path: str | None, overrides: Sequence[str]) -> Resolved:
    """As `load`, and also where each value came from (for `trainbox config`)."""
    problems: list[str] = []
    data = _read_file(path, problems) if path else {}
    loading = _Loading(overrides=_parse_overrides(overrides, problems), problems=problems)
    config = _build(Config, data, "", loading)
    for name in config.preflight.fatal:
        if name not in CHECK_NAMES:
            close = difflib.get_close_matches(name, CHECK_NAMES, n=1)
            suggestion = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"preflight.fatal names an unknown check {name!r}{suggestion}")
    problems.extend(name_problems(config.name))
    problems.extend(run_dir_problems(config.run_dir))
    # Readers take s3:// URLs too: another scheme or a typo is refused here, not read as a path.
    problems.extend(location.problems(config.train.init_from, what="train.init_from"))
    problems.extend(location.problems(config.train.resume, what="train.resume"))
    if problems:
        raise ConfigError(problems, hint=_hint(problems, path))
    # Checked on a config that is otherwise whole, so each line names a key set on purpose.
    fsdp, recovery = fsdp_problems(config.train), recovery_problems(config)
    if fsdp or recovery:
        hints = [hint for hint, found in ((FSDP_HINT, fsdp), (RECOVERY_HINT, recovery)) if found]
        raise ConfigError([*fsdp, *recovery], hint="; ".join(hints))
    return Resolved(config=config, sources=dict(loading.sources))


def name_problems(name: str) -> list[str]:
    """Why `name` cannot be the one folder runs/<name> (none when it can)."""
    shown = f"name={name[:24] + '...' if len(name) > 24 else name!r}"
    size = len(name.encode())
    if not name:
        return [f"{shown} must not be empty"]
    if name in (".", ".."):
        return [f"{shown} must not be '.' or '..'"]
    found = []
    if "/" in name or "\\" in name:
        found.append(f"{shown} must be one folder name, without '/' or '\\'")
    if any(ord(char) < 32 or ord(char) == 127 for char in name):
        found.append(f"{shown} must not contain control characters")
    if size > NAME_MAX_BYTES:
        found.append(f"{shown} ({size} bytes) must be at most {NAME_MAX_BYTES} bytes in UTF-8")
    return found


def run_dir_problems(run_dir: str) -> list[str]:
    """Why `run_dir` cannot be where a run writes (none when it can): a URL of another store,
    or a mistyped s3:// one, would otherwise become a local folder named `s3:`."""
    return location.problems(run_dir)


def _hint(problems: list[str], path: str | None) -> str:
    # A problem of one key alone gets that key's own hint; a mix gets the general one.
    for key, hint in (
        ("name=", NAME_HINT),
        ("run_dir=", RUN_DIR_HINT),
        ("train.init_from=", location.URL_HINT),
        ("train.resume=", location.URL_HINT),
    ):
        if all(problem.startswith(key) for problem in problems):
            return hint
    if path and all(problem.startswith(_unreadable(path)) for problem in problems):
        return _file_hint(path, Path.cwd())
    return HINT


def _unreadable(path: str) -> str:
    return f"config file {path!r} cannot be read"


def _file_hint(given: str, cwd: Path) -> str:
    """What to do about a --config file that cannot be read: the file most likely meant, and
    where a relative path is read from."""
    path = Path(given)
    if (cwd / path).is_file():
        return "make the file readable by this user (chmod a+r), or copy it where it can be read"
    near = _near_file(path, cwd)
    meant = f"did you mean --config {shlex.quote(str(near))}?" if near is not None else None
    if path.is_absolute():
        return meant or "give --config the path of an existing YAML file"
    where = f"--config {given} is read relative to the working directory {cwd}"
    if meant:
        return f"{meant} ({where})"
    return f"{where}: give a YAML file's path from there, or an absolute one"


def _near_file(given: Path, cwd: Path) -> Path | None:
    """The YAML file `given` probably meant, in the same form (relative or absolute): each part
    that is not there replaced by its closest sibling, a directory by its YAML file."""
    current = Path(given.anchor)
    for part in given.parts[1 if given.anchor else 0 :]:
        close = [part] if (cwd / current / part).exists() else []
        close = close or difflib.get_close_matches(part, _names(cwd / current), n=1, cutoff=0.6)
        if not close:
            return None
        current = current / close[0]
    if (cwd / current).is_dir():
        inside = [name for name in _names(cwd / current) if name.endswith((".yaml", ".yml"))]
        close = difflib.get_close_matches("config.yaml", inside, n=1, cutoff=0.0)
        current = current / close[0] if close else current
    return current if current != given and (cwd / current).is_file() else None


def _names(directory: Path) -> list[str]:
    try:
        return sorted(child.name for child in directory.iterdir())
    except OSError:
        return []


def as_dict(config: Config) -> dict[str, Any]:
    """Plain data, in field order (config.yaml and hashing)."""
    return dataclasses.asdict(config)


def to_yaml(config: Config) -> str:
    """The fully resolved config as YAML, loadable again with `--config`."""
    return yaml.safe_dump(as_dict(config), sort_keys=False)


def fingerprint(value: Any) -> str:
    """SHA-256 of any config section, independent of key order."""
    instance = dataclasses.is_dataclass(value) and not isinstance(value, type)
    data = dataclasses.asdict(value) if instance else value
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def reference_markdown() -> str:
    """The config reference table in docs/configuration.md, generated from the dataclasses."""
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key, kind, spec, default in leaves(Config, ""):
        rows.append(f"| `{key}` | {_type_name(kind)} | `{default!r}` | {spec.metadata['doc']} |")
    return "\n".join(rows)


def _read_file(path: str, problems: list[str]) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        problems.append(f"{_unreadable(path)} ({err.strerror})")
        return {}
    except UnicodeDecodeError as err:
        where = f"byte {err.object[err.start]:#04x} at offset {err.start}"
        problems.append(f"config file {path!r} is not UTF-8 text ({where})")
        return {}
    data, error = _parse_yaml(text)
    if error is not None:
        problems.append(f"config file {path!r}{error}")
        return {}
    if data is None:
        return {}
    if not isinstance(data, dict):
        problems.append(
            f"config file {path!r} must hold a mapping of keys, not {type(data).__name__}"
        )
        return {}
    return data


class _Loading:
    """What building the config carries along: the overrides, problems, and sources so far."""

    def __init__(self, *, overrides: list[tuple[str, str]], problems: list[str]) -> None:
        # The overrides in the order given: a mapping override and its keys apply in order.
        self.ordered = overrides
        # The last value given for each key: a single value's last override wins.
        self.cli = dict(overrides)
        self.problems = problems
        self.sources: dict[str, str] = {}

    def record(self, key: str, source: str) -> None:
        """`key` (and everything under it) now comes from `source`."""
        for known in [k for k in self.sources if k.startswith(f"{key}.")]:
            del self.sources[known]
        self.sources[key] = source


def _parse_overrides(overrides: Sequence[str], problems: list[str]) -> list[tuple[str, str]]:
    parsed: list[tuple[str, str]] = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            problems.append(f"override {item!r} is not key=value")
            continue
        parsed.append((key.strip(), value))
    return parsed


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading `5e-3` as the number YAML 1.2 (and every user) means.

    PyYAML follows YAML 1.1, where a float needs a dot: `lr: 5e-3` was the string '5e-3', which
    typed keys forgave but `*.args` passed to user code as it was.
    """


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


class _Refused(yaml.YAMLError):
    """A document beyond the limits, with an alias inside its own anchor, or not text."""


# YAML's escapes can write half of a UTF-16 pair ("\ud800"): no UTF-8 text holds one.
_SURROGATE = re.compile("[\ud800-\udfff]")


# Stands in the key path for a mapping key that is itself being composed.
_A_KEY = object()


class _LimitedLoader(_Loader):
    """`_Loader` that refuses a document beyond MAX_DEPTH or MAX_VALUES as it composes it.

    Sizes are measured on the node graph, where an alias is one shared node, so measuring costs
    no more than reading; `within` names where the document sits (an override's key).
    """

    def __init__(self, text: str, within: str) -> None:
        super().__init__(text)
        self.within = within
        self.path: list[Any] = []
        # id(node) -> (values, levels) as expanded; a node is absent until it is complete.
        self.measured: dict[int, tuple[int, int]] = {}

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        # types-PyYAML leaves Parser.peek_event unannotated; it returns the next Event.
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        self.path.append(_A_KEY if parent is not None and index is None else index)
        try:
            if self._depth() > MAX_DEPTH:
                raise _Refused(
                    self._refusal(f"is nested deeper than {MAX_DEPTH} levels", event.start_mark)
                )
            # Every node is measured once complete, so an unmeasured anchor is an ancestor.
            anchored = self.anchors.get(event.anchor) if isinstance(event, AliasEvent) else None
            if anchored is not None and id(anchored) not in self.measured:
                problem = "refers to itself (an alias inside its own anchor)"
                raise _Refused(self._refusal(problem, event.start_mark))
            node = super().compose_node(parent, index)
            if node is not None:
                self._measure(node, event)
            if isinstance(node, yaml.ScalarNode) and (half := _SURROGATE.search(node.value)):
                problem = f"holds a lone surrogate {half.group()!r}, which is not text"
                raise _Refused(self._refusal(problem, event.start_mark))
            return node
        finally:
            self.path.pop()

    def fetch_flow_collection_start(self, TokenClass: type[yaml.Token]) -> None:
        # The scanner reads up to 1,024 characters ahead of the composer, in time quadratic in
        # the open brackets: stop at the limit, naming the key the composer has reached.
        if self.flow_level >= MAX_DEPTH:
            problem = f"is nested deeper than {MAX_DEPTH} levels"
            raise _Refused(self._refusal(problem, self.get_mark()))
        super().fetch_flow_collection_start(TokenClass)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # PyYAML's own constructors fail with ValueError, KeyError and others on a value that
        # does not fit its explicit tag (`!!int x`); say so as a YAML error at the value.
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            kind = str(node.tag).rpartition(":")[2]
            shown = f"!!{kind} {_SHOWN.repr(node.value)} is not a valid {kind}"
            raise yaml.constructor.ConstructorError(None, None, shown, node.start_mark) from err

    def _depth(self) -> int:
        # The root is not a level; an override's value sits under its key's levels.
        return len(self.path) - 1 + (self.within.count(".") + 1 if self.within else 0)

    def _measure(self, node: yaml.Node, event: yaml.Event) -> None:
        if id(node) not in self.measured:
            children = [
                child
                for item in (node.value if isinstance(node.value, list) else [])
                for child in (item if isinstance(item, tuple) else (item,))
            ]
            sizes = [self.measured[id(child)] for child in children]
            self.measured[id(node)] = (
                1 + sum(values for values, _ in sizes),
                1 + max((levels for _, levels in sizes), default=0),
            )
        values, levels = self.measured[id(node)]
        if self._depth() - 1 + levels > MAX_DEPTH:
            raise _Refused(
                self._refusal(f"is nested deeper than {MAX_DEPTH} levels", event.start_mark)
            )
        if values > MAX_VALUES:
            problem = f"expands to more than {MAX_VALUES} values, counting each use of an alias"
            raise _Refused(self._refusal(problem, event.start_mark))

    def _refusal(self, problem: str, mark: Any) -> str:
        where = self.within
        for part in self.path[1:]:
            if isinstance(part, int):
                where += f"[{part}]"
            elif isinstance(part, yaml.ScalarNode):
                where += f".{part.value}" if where else str(part.value)
            else:
                where += ".<key>" if where else "<key>"
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return f"{_clipped(where) or 'the top level'} {problem}{at}"


def _clipped(key: str) -> str:
    # A key 5,000 levels deep is named by its two ends, so the problem stays a readable line.
    return key if len(key) <= 120 else f"{key[:70]}...{key[-40:]}"


def parse_yaml(text: str) -> Any:
    """`text` read as a config file is (within the limits), or None where that fails."""
    data, error = _parse_yaml(text)
    return None if error is not None else data


def _parse_yaml(text: str, within: str = "") -> tuple[Any, str | None]:
    """The YAML value of `text`, or None and why not, on one line, to follow what was read."""
    try:
        # The reader checks the whole text as the loader is made: inside the `try` too.
        loader = _LimitedLoader(text, within)
        try:
            return loader.get_single_data(), None
        finally:
            loader.dispose()
    except _Refused as err:
        return None, f": {err}"
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        reason = " ".join(str(getattr(err, "problem", None) or err).split())
        return None, f" is not valid YAML{at}: {reason}"


def _build(cls: type, data: Any, prefix: str, loading: _Loading) -> Any:
    cli, problems = loading.cli, loading.problems
    if not isinstance(data, dict):
        problems.append(f"{prefix.rstrip('.')} must be a mapping, not {_SHOWN.repr(data)}")
        data = {}
    specs = {spec.name: spec for spec in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    given = [f"{prefix}{key}" for key in data] + [key for key in cli if key.startswith(prefix)]
    _reject_unknown(given, specs, prefix, problems)
    values: dict[str, Any] = {}
    for name, spec in specs.items():
        key, kind = f"{prefix}{name}", hints[name]
        leaf = not _is_section(kind) and kind != dict[str, Any]
        if leaf and any(other.startswith(f"{key}.") for other in cli):
            problems.append(f"{key} is a single value, not a section with keys")
        if _is_section(kind) and key in cli:
            problems.append(f"{key} is a section; set its keys instead, e.g. {key}.<key>=...")
        if _is_section(kind):
            values[name] = _build(kind, data.get(name, {}), f"{key}.", loading)
            continue
        if name in data:
            loading.record(key, "file")
        if kind == dict[str, Any]:
            values[name] = _mapping(key, data.get(name, {}), loading)
        elif key in cli:
            loading.record(key, "override")
            values[name] = _check(key, _parse_cli(cli[key], kind), kind, spec, problems)
        elif name in data:
            values[name] = _check(key, data[name], kind, spec, problems)
    return cls(**{name: value for name, value in values.items() if value is not _INVALID})


def _reject_unknown(
    keys: list[str], specs: Mapping[str, dataclasses.Field[Any]], prefix: str, problems: list[str]
) -> None:
    # Only the next component is judged here; deeper ones are judged when their section is built.
    known = [f"{prefix}{name}" for name in specs]
    for head in dict.fromkeys(prefix + key[len(prefix) :].split(".")[0] for key in keys):
        if head not in known:
            close = difflib.get_close_matches(head, known, n=1)
            suggestion = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"unknown key {head!r}{suggestion}")


def _is_mapping(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) for k in value)


def _mapping(key: str, value: Any, loading: _Loading) -> Any:
    """A `*.args` mapping after the overrides, in the order given.

    `key={...}` replaces the whole mapping; `key.a.b=v` sets one entry, nesting at each dot.
    """
    if not _is_mapping(value):
        loading.problems.append(
            f"{key} must be a mapping of names to values, not {_SHOWN.repr(value)}"
        )
        return _INVALID
    merged = copy.deepcopy(value)
    for dotted, text in loading.ordered:
        if dotted == key:
            parsed, error = _parse_yaml(text, key) if text.strip() else (text, None)
            if error is not None:
                loading.problems.append(f"{key}={_SHOWN.repr(text)}{error}")
            elif not _is_mapping(parsed):
                loading.problems.append(
                    f"{key}={_SHOWN.repr(parsed)} must be a mapping of names to values"
                )
            else:
                merged = parsed
                loading.record(key, "override")
        elif dotted.startswith(f"{key}."):
            problem = _set_entry(merged, key, dotted, _parse_cli(text, Any))
            if problem is None:
                loading.record(dotted, "override")
            else:
                loading.problems.append(problem)
    found = _plain_problem(merged, key, key.count(".") + 1)
    if found is not None:
        loading.problems.append(found)
    return merged


# What a `*.args` value may be: what JSON holds, so every rank hashes it alike, the resolved
# config.yaml loads back, and a checkpoint holding it loads with `weights_only`. PyYAML would
# also give dates, sets, bytes and tuples (!!omap, !!pairs), and keys of any type.
PLAIN = "*.args hold strings, numbers, true/false, null, lists and mappings; quote text"
_KINDS = {"date": "a date", "datetime": "a date", "set": "a set", "bytes": "bytes"}


def _plain_problem(value: Any, where: str, depth: int) -> str | None:
    """Why `value`, `depth` levels down at `where`, is not plain data (None when it is)."""
    if depth > MAX_DEPTH:
        return f"{_clipped(where)} is nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, str) and _SURROGATE.search(value):
        return f"{_clipped(where)}={_SHOWN.repr(value)} must be UTF-8 text"
    if value is None or isinstance(value, bool | int | float | str):
        return None
    if isinstance(value, list):
        items = enumerate(value)
        return next(
            (
                found
                for index, item in items
                if (found := _plain_problem(item, f"{where}[{index}]", depth + 1)) is not None
            ),
            None,
        )
    if isinstance(value, dict):
        kinds = {type(name) for name in value}
        odd = [name for name in value if type(name) not in (str, int)]
        halves = [name for name in value if isinstance(name, str) and _SURROGATE.search(name)]
        if halves:
            return f"{_clipped(where)} has a key {_SHOWN.repr(halves[0])} that is not UTF-8 text"
        if odd:
            shown = "null" if odd[0] is None else _SHOWN.repr(odd[0])
            return f"{where} has a key {shown} that is not a string or an integer; {PLAIN}"
        if len(kinds) > 1:
            return f"{where} has keys of more than one type (strings and integers); {PLAIN}"
        return next(
            (
                found
                for name, item in value.items()
                if (found := _plain_problem(item, f"{where}.{name}", depth + 1)) is not None
            ),
            None,
        )
    kind = type(value).__name__
    return f"{where} is {_KINDS.get(kind, f'a {kind}')}; {PLAIN}"


def _set_entry(mapping: dict[str, Any], key: str, dotted: str, value: Any) -> str | None:
    """Set `dotted` (under `key`) in `mapping`, making nested mappings; or say why it cannot."""
    path = dotted[len(key) + 1 :].split(".")
    if "" in path:
        return f"{dotted} names an empty key"
    node = mapping
    for depth, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            above = ".".join([key, *path[: depth + 1]])
            return f"{above} is {child!r}, not a mapping, so {dotted} cannot be set"
        node = child
    node[path[-1]] = value
    return None


def _parse_cli(text: str, kind: Any) -> Any:
    # A str field takes the text as typed (so `name=007` stays "007"), and so does a choice
    # (YAML would read `amp=off` as false); others parse as YAML.
    if kind is str or typing.get_origin(kind) is Literal:
        return text
    parsed, error = _parse_yaml(text) if text.strip() else (text, None)
    return text if error is not None else parsed


def _check(
    key: str, value: Any, kind: Any, spec: dataclasses.Field[Any], problems: list[str]
) -> Any:
    value = _yaml11_forgiven(value, kind)
    problem = _type_problem(value, kind)
    if problem is None:
        problem = _bound_problem(value, spec)
    if problem is None and spec.name in CALLABLE_FIELDS and _bad_callable(value, spec):
        problem = "must look like package.module:function"
    if problem is not None:
        problems.append(f"{key}={_SHOWN.repr(value)} {problem}")
        return _INVALID
    return float(value) if kind is float else value


def _bad_callable(value: str, spec: dataclasses.Field[Any]) -> bool:
    # An empty value means "the built-in one" where the default is empty.
    return not FACTORY_PATTERN.fullmatch(value) and not (value == "" == spec.default)


def _yaml11_forgiven(value: Any, kind: Any) -> Any:
    # PyYAML follows YAML 1.1: `lr: 1e-3` stays a string and `amp: off` becomes false.
    # Both are what the user meant, so read them that way.
    if kind is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    if typing.get_origin(kind) is Literal and isinstance(value, bool):
        word = "on" if value else "off"
        return word if word in typing.get_args(kind) else value
    return value


def _type_problem(value: Any, kind: Any) -> str | None:
    if _is_union(kind):
        options = typing.get_args(kind)
        if any(_type_problem(value, option) is None for option in options):
            return None
        return "must be " + " or ".join(_type_name(option).replace("`", "") for option in options)
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        if isinstance(value, list) and all(_type_problem(v, item) is None for v in value):
            return None
        return f"must be a list of {_type_name(item)}"
    if typing.get_origin(kind) is Literal:
        choices = typing.get_args(kind)
        return None if value in choices else f"must be one of {', '.join(map(str, choices))}"
    if kind is bool:
        return None if isinstance(value, bool) else "must be true or false"
    if kind is int:
        return (
            None if isinstance(value, int) and not isinstance(value, bool) else "must be an integer"
        )
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "must be a number"
        # NaN passes every bound check and infinity most; torch then fails far from the cause.
        return None if math.isfinite(value) else "must be a finite number"
    if kind is str:
        if not isinstance(value, str):
            return "must be a string"
        # argv's bytes that are not UTF-8 arrive as lone surrogates (surrogateescape).
        return "must be UTF-8 text" if _SURROGATE.search(value) else None
    raise TypeError(f"unsupported config field type {kind!r}")  # a bug in the schema, not input


def _bound_problem(value: Any, spec: dataclasses.Field[Any]) -> str | None:
    low, high = spec.metadata.get("minimum"), spec.metadata.get("maximum")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if low is not None and value < low:
        return f"must be at least {low}"
    if high is not None and value > high:
        return f"must be at most {high}"
    return None


def leaves(cls: type, prefix: str) -> list[tuple[str, Any, dataclasses.Field[Any], Any]]:
    """Every value key under `cls` as (dotted key, type, field, default), in field order."""
    hints = typing.get_type_hints(cls)
    found: list[tuple[str, Any, dataclasses.Field[Any], Any]] = []
    defaults = cls()
    for spec in dataclasses.fields(cls):
        kind = hints[spec.name]
        if _is_section(kind):
            found.extend(leaves(kind, f"{prefix}{spec.name}."))
        else:
            found.append((f"{prefix}{spec.name}", kind, spec, getattr(defaults, spec.name)))
    return found


def _is_section(kind: object) -> typing.TypeGuard[type]:
    # A field typed with a dataclass is a section of keys, not a single value.
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def _is_union(kind: Any) -> bool:
    # `int | str` is a types.UnionType, but `int | Literal["auto"]` is a typing.Union.
    return isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union


def _type_name(kind: Any) -> str:
    if _is_union(kind):
        return " \\| ".join(_type_name(option) for option in typing.get_args(kind))
    if typing.get_origin(kind) is list:
        return f"list of {_type_name(typing.get_args(kind)[0])}"
    if typing.get_origin(kind) is Literal:
        return " \\| ".join(f"`{choice}`" for choice in typing.get_args(kind))
    if kind == dict[str, Any]:
        return "mapping"
    return kind.__name__ if isinstance(kind, type) else str(kind)
