"""Run files: a `fedbayes local` or `fedbayes run` command written down as TOML (`--config FILE`), and the one a
`fedbayes local` run leaves in its workdir, so that `fedbayes local --resume WORKDIR` needs nothing else.

A run file holds the command's own options at its top level, named as the flags without their `--` (`clients = 4`,
`parallel-tasks = 2`; `fedbayes run`: `app` and `superlink`, its positional arguments), and run-config keys, named as
`--set` names them, in its `[run-config]` table. Flags and `--set` (`-c` for `fedbayes run`) on the command line win
over the file. The file is data: its size is bounded before it is read, and an unknown option or key, or a value of
the wrong type, is refused naming the file and the key (with the closest known name) before any process starts.

The workdir's file (`RUN_FILE`) is the same format, written by `fedbayes local` once its checks have passed, before
its first process starts: the options and run config as resolved (paths absolute, a preset's values spelt out). A
resume reads it as its base; what the command line gives beside `--resume` may change only what a resumed federation
may change (the rounds, the executor, the results file, the run-config keys server/checkpoint.py lists as
RESUMABLE_KEYS), and is said at the start; anything else is refused, as the checkpoint would refuse it once the
federation had started.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedbayes.deploy.flower_app import toml_value
from fedbayes.tasks.config import ConfigError, unknown_keys, unnamed_code
from fedbayes.tasks.storage import read_bounded, write_atomically

if TYPE_CHECKING:
    from fedbayes.deploy.launcher import LocalRun

RUN_FILE = "run.toml"  # the run file `fedbayes local` writes into its workdir
RUN_CONFIG_TABLE = "run-config"
# A run file is a command line and its run config: a few kilobytes. A megabyte holds any real one and keeps a file
# that is no run file (a dataset passed by mistake) from being read whole.
MAX_RUN_FILE_BYTES = 2**20
WRITTEN_BY = "# Written by `fedbayes local` as the run started"  # the first line of a workdir's run file: ours
NOT_IN_FILE = frozenset({"help", "config", "resume", "set"})  # what only the command line gives
# `fedbayes local` options a resume may change; every other one would make it another federation
RESUMABLE_OPTIONS = frozenset({"rounds", "executor", "parallel-tasks", "results"})
RUN_OPTIONS = ("app", "superlink")  # `fedbayes run` (`flwr run`): its positional arguments


@dataclass(frozen=True)
class RunFile:
    """A run file's options (name without `--` -> value) and run config (key -> value), as TOML typed them."""

    path: Path
    options: dict[str, Any] = field(default_factory=dict)
    run_config: dict[str, Any] = field(default_factory=dict)

    def tokens(self) -> list[str]:
        """The options as command-line arguments (`--name=value`, so that a value that begins with `-` is a value).

        Returns:
            One argument per option, in the file's order.
        """
        return [f"--{name}={value}" for name, value in self.options.items()]


@dataclass(frozen=True)
class LocalCommand:
    """A `fedbayes local` command line with its run files: `argv` to parse (a stored run file's options, then the
    --config file's, then the command line's: a later one wins), the workdir's run file when the command resumes
    from one, and the --config file."""

    argv: list[str]
    stored: RunFile | None
    given: RunFile | None  # the --config file


def option_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The options of `parser` a run file may give, by their name without `--`.

    Args:
        parser: a command's parser (`fedbayes local`'s).

    Returns:
        Option name (its last flag, without `--`) -> its argparse action, leaving out what only the command line
        gives (NOT_IN_FILE).
    """
    return {
        action.option_strings[-1].removeprefix("--"): action
        for action in parser._actions  # argparse offers no public list of a parser's arguments
        if action.option_strings and action.dest not in NOT_IN_FILE
    }


def read_run_file(
    path: Path, options: Mapping[str, Callable[[str, Any], Any]], run_config_keys: Iterable[str]
) -> RunFile:
    """The run file at `path`, read and checked.

    Args:
        path: the run file (TOML, at most MAX_RUN_FILE_BYTES).
        options: per option a file may give, its check: `check(name, value)` returns the value or raises ValueError.
        run_config_keys: names that are run-config keys: one at the file's top level is refused, pointing at
            [run-config]; a key in [run-config] is checked later, against the strategy's keys (`check_run_config`).

    Returns:
        The file's options, as their checks returned them, and its [run-config] table as TOML typed it.

    Raises:
        ValueError: naming the file: it cannot be read, is over MAX_RUN_FILE_BYTES, is not UTF-8 or not TOML, its
            [run-config] is not a table or holds a table or list, or it gives an unknown or misplaced option or a value
            of the wrong type.
    """
    try:
        text = read_bounded(path, MAX_RUN_FILE_BYTES, "a run file").decode()
    except OSError as error:
        raise ValueError(f"run file {path}: cannot read it ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"run file {path} is not UTF-8 text: {error}") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"run file {path} is not TOML: {error}") from None
    run_config = document.pop(RUN_CONFIG_TABLE, {})
    if not isinstance(run_config, dict):
        raise ValueError(
            f"run file {path}: '{RUN_CONFIG_TABLE}' must be a table ([{RUN_CONFIG_TABLE}]), got {run_config!r}"
        )
    keys = set(run_config_keys)
    misplaced = [name for name in document if name not in options and name in keys]
    if misplaced:
        raise ValueError(
            f"run file {path}: '{misplaced[0]}' is a run-config key, not an option: put it under [{RUN_CONFIG_TABLE}]"
        )
    unknown = [name for name in document if name not in options]
    if unknown:
        raise ValueError(
            f"run file {path}: {unknown_keys(unknown, options, 'option')} (the options are "
            f"{', '.join(options)}; run-config keys go under [{RUN_CONFIG_TABLE}])"
        )
    nested = [name for name, value in run_config.items() if isinstance(value, dict | list)]
    if nested:
        raise ValueError(
            f"run file {path}: [{RUN_CONFIG_TABLE}] '{nested[0]}' must be a single value, not a table or list"
        )
    return RunFile(path, {name: options[name](name, value) for name, value in document.items()}, run_config)


def local_option_checks(parser: argparse.ArgumentParser, path: Path) -> dict[str, Callable[[str, Any], Any]]:
    """A check per `fedbayes local` option a run file may give: the TOML type the option takes (a string for a name
    or path, a number for a count), then the option's own type and choices, as the command line checks them.

    Args:
        parser: `fedbayes local`'s parser.
        path: the run file, for the messages.

    Returns:
        Option name -> its check, `check(name, value)`, which returns the value or raises ValueError naming the file.
    """
    return {name: _option_check(action, path) for name, action in option_actions(parser).items()}


def _option_check(action: argparse.Action, path: Path) -> Callable[[str, Any], Any]:
    numeric = action.type not in (None, str, Path)

    def check(name: str, value: Any) -> Any:
        if numeric and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"run file {path}: '{name}' must be a number, got {value!r}")
        if not numeric and not isinstance(value, str):
            raise ValueError(f"run file {path}: '{name}' must be a string, got {value!r}")
        if numeric:
            parse = action.type
            assert callable(parse)  # a numeric option's type is a function (tasks.config checked_number)
            try:
                parse(str(value))  # the option's own check
            except argparse.ArgumentTypeError as error:
                raise ValueError(f"run file {path}: '{name}' {error}") from None
        if action.choices is not None and value not in action.choices:
            raise ValueError(
                f"run file {path}: '{name}' must be one of {', '.join(map(str, action.choices))}, got {value!r}"
            )
        return value

    return check


def check_run_config(run_file: RunFile, known: Mapping[str, Any]) -> dict[str, Any]:
    """The run file's run config, each key known (`known`: name -> tasks.config.Key) and its value of the key's type
    and check; the values parsed (an int where a float is declared is that float).

    Args:
        run_file: the run file.
        known: the run's keys, name -> tasks.config.Key.

    Returns:
        Key -> its parsed value, in the file's order.

    Raises:
        ConfigError: naming the file and the key, with the closest known key for an unknown one.
    """
    unknown = [name for name in run_file.run_config if name not in known]
    if unknown:
        raise ConfigError(f"run file {run_file.path}: [{RUN_CONFIG_TABLE}] {unknown_keys(unknown, known)}")
    try:
        return {name: known[name].parse(value) for name, value in run_file.run_config.items()}
    except ConfigError as error:
        raise ConfigError(f"run file {run_file.path}: [{RUN_CONFIG_TABLE}] {error}") from None


# ---- fedbayes local -------------------------------------------------------------------------------------------------
def local_command(argv: Sequence[str], parser: argparse.ArgumentParser, run_config_keys: Iterable[str]) -> LocalCommand:
    """`fedbayes local ARGV` with its run files: the --config file's options, and on a resume from a workdir that holds
    a RUN_FILE (`--resume WORKDIR`, or `--workdir WORKDIR --resume`) the options it was started with, before the
    command line's.

    Args:
        argv: the command line after `fedbayes local`.
        parser: `fedbayes local`'s own parser: the options a file may give, and their checks.
        run_config_keys: every run-config key's name (one at a file's top level is pointed to [run-config]).

    Returns:
        The arguments to parse (the stored file's options, the --config file's, then `argv`), and both run files.

    Raises:
        ValueError: a run file is refused (read_run_file); the resume names no workdir or two; its workdir holds no
            RUN_FILE and the command gives no options; the workdir's file names code the command does not name.
    """
    prepass = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    prepass.add_argument("--config", type=Path)
    prepass.add_argument("--resume", nargs="?", const=True, default=False)
    prepass.add_argument("--workdir", type=Path)
    prepass.add_argument("--strategy")
    prepass.add_argument("--rounds")
    prepass.add_argument("--clients")
    prepass.add_argument("--set", action="append", default=[])
    known, _ = prepass.parse_known_args(list(argv))
    keys = list(run_config_keys)
    given = read_run_file(known.config, local_option_checks(parser, known.config), keys) if known.config else None
    stored = None
    if known.resume:
        workdir = resume_workdir(known.resume, known.workdir, given)
        stored = _stored_run_file(workdir, known, given, local_option_checks(parser, workdir / RUN_FILE), keys)
    files = [run_file for run_file in (stored, given) if run_file is not None]
    return LocalCommand([token for run_file in files for token in run_file.tokens()] + list(argv), stored, given)


def _stored_run_file(
    workdir: Path,
    known: argparse.Namespace,
    given: RunFile | None,
    options: Mapping[str, Callable[[str, Any], Any]],
    keys: list[str],
) -> RunFile | None:
    """The workdir's run file a resume reads; None where there is none and the command gives the options itself
    (`known`: its --strategy, --rounds, --clients and --set; `given`: its --config file)."""
    path = workdir / RUN_FILE
    if not path.is_file():
        if not any((known.strategy, known.rounds, known.clients, given)):
            raise ValueError(f"--resume: {workdir} {_not_resumable(workdir)}")
        return None
    stored = read_run_file(path, options, keys)
    given_options, given_config = (given.options, given.run_config) if given else ({}, {})
    models = [item.partition("=")[2] for item in known.set if item.partition("=")[0] == "model"]
    strategy = known.strategy or given_options.get("strategy")
    check_stored_code(stored, strategy, models[-1] if models else given_config.get("model"))
    return stored


def _not_resumable(workdir: Path) -> str:
    """Why `--resume WORKDIR` alone cannot resume WORKDIR, which holds no RUN_FILE."""
    from fedbayes.deploy.launcher import FLWR_HOME  # the launcher writes run files: imported where it is used

    if not (workdir / FLWR_HOME).is_dir():
        return f"holds no federation to resume (no {FLWR_HOME}/ in it)"
    return (
        f"holds no {RUN_FILE} (a federation started before fedbayes wrote run files): give the command it was "
        "started with beside --resume, once; that start writes the file"
    )


def local_run_config(command: LocalCommand, known: Mapping[str, Any]) -> dict[str, Any]:
    """The run config of `command`'s run files, each checked (`check_run_config`), the --config file's winning over
    the workdir's.

    Args:
        command: the command with its run files (`local_command`).
        known: the run's keys, name -> tasks.config.Key.

    Returns:
        Key -> parsed value; empty without run files.

    Raises:
        ConfigError: a run file's key is unknown or its value is refused.
    """
    files = [run_file for run_file in (command.stored, command.given) if run_file is not None]
    return {name: value for run_file in files for name, value in check_run_config(run_file, known).items()}


def resume_workdir(resume: str | bool, workdir: Path | None, given: RunFile | None) -> Path:
    """The workdir a resume continues: `--resume WORKDIR`, else --workdir (on the command line, else in the --config
    file).

    Args:
        resume: `--resume`'s value: the workdir, or True where it was given alone.
        workdir: `--workdir` on the command line, or None.
        given: the --config file, or None.

    Returns:
        The workdir, as given (not resolved).

    Raises:
        ValueError: none is named, or --resume and --workdir name two.
    """
    if isinstance(resume, str):
        if workdir is not None and workdir.resolve() != Path(resume).resolve():
            raise ValueError(f"--resume {resume} and --workdir {workdir} name two workdirs; give one")
        return Path(resume)
    if workdir is not None:
        return workdir
    if given is not None and "workdir" in given.options:
        return Path(given.options["workdir"])
    raise ValueError("--resume needs the workdir of the federation to resume: --resume WORKDIR")


def remembered(spec: LocalRun) -> RunFile:
    """What a workdir's run file holds of a run: its options and run config as resolved.

    Args:
        spec: the run as `fedbayes local` resolved it.

    Returns:
        The options (parallel-tasks and results only where set; results absolute) and the `--set` overrides, at
        path RUN_FILE (relative).
    """
    options: dict[str, Any] = {
        "strategy": spec.strategy,
        "clients": spec.clients,
        "rounds": spec.rounds,
        "dataset": spec.dataset,
        "fraction": spec.fraction,
        "split": spec.split,
        "seed": spec.seed,
        "executor": spec.executor,
    }
    if spec.parallel_tasks is not None:
        options["parallel-tasks"] = spec.parallel_tasks
    if spec.results is not None:
        options["results"] = str(spec.results.resolve())
    return RunFile(Path(RUN_FILE), options, dict(spec.overrides))


def run_file_text(run_file: RunFile) -> str:
    """The TOML of a workdir's run file (first line WRITTEN_BY).

    Args:
        run_file: what the file holds (`remembered`).

    Returns:
        The text, ending with a newline.
    """
    lines = [
        f"{WRITTEN_BY}: its options and run config, resolved.",
        "# `fedbayes local --resume WORKDIR` reads it; `fedbayes local --config FILE --workdir NEW` starts another",
        "# federation like it.",
        *(f"{name} = {toml_value(value)}" for name, value in run_file.options.items()),
        "",
        f"[{RUN_CONFIG_TABLE}]",
        *(f"{name} = {toml_value(value)}" for name, value in run_file.run_config.items()),
    ]
    return "\n".join(lines) + "\n"


def write_run_file(workdir: Path, spec: LocalRun) -> Path | None:
    """Write the workdir's run file for `spec`; where that file exists and is not ours (its first line is not
    WRITTEN_BY) it is left as it is.

    Args:
        workdir: the federation's workdir; made if missing.
        spec: the run as resolved.

    Returns:
        The file, or None where it was left.

    Raises:
        FileTooLarge: an existing run file is over MAX_RUN_FILE_BYTES.
        OSError: the file cannot be read or written.
    """
    path = workdir / RUN_FILE
    if path.exists() and not read_bounded(path, MAX_RUN_FILE_BYTES, "a run file").startswith(WRITTEN_BY.encode()):
        return None
    write_atomically(path, run_file_text(remembered(spec)).encode(), mode=0o644)
    return path


def resume_changes(
    stored: RunFile, spec: LocalRun, defaults: Mapping[str, Any], resumable_keys: Iterable[str]
) -> list[str]:
    """What `spec` changes of the run its workdir's run file `stored` describes, as lines to print ("rounds 5 (was
    3)"); a key absent from a run config is at its default (`defaults`).

    Args:
        stored: the workdir's run file.
        spec: the resumed run as resolved.
        defaults: the strategy's run-config defaults, key -> value.
        resumable_keys: the run-config keys a resume may change (server/checkpoint.py's RESUMABLE_KEYS).

    Returns:
        One line per change, options first, each sorted by name; empty when nothing changes.

    Raises:
        ValueError: it changes what a resumed federation keeps (an option outside RESUMABLE_OPTIONS, a run-config key
            outside `resumable_keys`), naming it, its stored value and the file.
    """
    now = remembered(spec)
    changes: list[str] = []
    refused: list[str] = []
    for name in sorted(set(stored.options) | set(now.options)):
        was, becomes = stored.options.get(name), now.options.get(name)
        if was != becomes:
            (changes if name in RESUMABLE_OPTIONS else refused).append(f"{name} {becomes!r} (was {was!r})")
    resumable = set(resumable_keys)
    for name in sorted(set(stored.run_config) | set(now.run_config)):
        was, becomes = stored.run_config.get(name, defaults.get(name)), now.run_config.get(name, defaults.get(name))
        if was != becomes:
            (changes if name in resumable else refused).append(f"run config {name} {becomes!r} (was {was!r})")
    if refused:
        raise ValueError(
            f"--resume: {stored.path} says how this federation was started, and a resumed federation keeps its "
            f"strategy, clients, data, split, seed and algorithm settings; this command changes {'; '.join(refused)}. "
            "Drop those flags to resume, or start a new federation with another --workdir"
        )
    return changes


def check_stored_code(stored: RunFile, given_strategy: str | None, given_model: str | None) -> None:
    """Refuse a resume whose workdir's run file names code ('<module>:<attribute>' for strategy or model) that this
    command does not name itself: a workdir is data, and fedbayes runs no code a file names (tasks.config
    unnamed_code).

    Args:
        stored: the workdir's run file.
        given_strategy: the command's --strategy (or its --config file's), None where it gives none.
        given_model: the command's last `--set model=` (or its --config file's), None where it gives none.

    Raises:
        ValueError: the stored strategy or model names code the command does not name itself.
    """
    values = {"strategy": stored.options.get("strategy"), "model": stored.run_config.get("model")}
    if not any(isinstance(value, str) and ":" in value for value in values.values()):
        return  # built-in names only; a command that names others is refused as a change (resume_changes)
    named = {key: value for key, value in (("strategy", given_strategy), ("model", given_model)) if value is not None}
    problem = unnamed_code(
        str(stored.path),
        values,
        named,
        how=lambda key, reference: f"--strategy {reference}" if key == "strategy" else f"--set model={reference}",
    )
    if problem:
        raise ValueError(f"--resume: {problem}")


# ---- fedbayes run ---------------------------------------------------------------------------------------------------
def flwr_run_argv(argv: Sequence[str], known_keys: Callable[[str], Mapping[str, Any]]) -> list[str]:
    """`fedbayes run ARGV` with its --config file spelt out as `flwr run` arguments: the file's app and superlink
    where the command line names none, and its run config as a first `-c` (a later `-c` wins).

    Args:
        argv: the command line after `fedbayes run`.
        known_keys: `known_keys(strategy)`: every run-config key of that strategy, by name ("" for the core keys).

    Returns:
        The `flwr run` arguments; without --config, ARGV as it is.

    Raises:
        ValueError, ConfigError: the file is refused (read_run_file, check_run_config); --config has no value; the
            command line names an app but the file a superlink (whose position would then be ambiguous); the command
            line's -c is a TOML file, which flwr run takes alone; a string value holds a double quote, which `-c`
            cannot carry.
    """
    tokens = list(argv)
    config_at = next(
        (i for i, token in enumerate(tokens) if token == "--config" or token.startswith("--config=")), None
    )
    if config_at is None:
        return tokens
    if tokens[config_at] == "--config":
        if config_at + 1 >= len(tokens):
            raise ValueError("--config needs a run file: --config FILE.toml")
        path = Path(tokens.pop(config_at + 1))
    else:
        path = Path(tokens[config_at].removeprefix("--config="))
    tokens.pop(config_at)
    run_file = read_run_file(path, {name: _string_option(path) for name in RUN_OPTIONS}, known_keys(""))
    run_config = check_run_config(run_file, known_keys(str(run_file.run_config.get("strategy", ""))))
    parsed = _flwr_run_positionals(tokens)
    if parsed.superlink is None and parsed.app is not None and "superlink" in run_file.options:
        raise ValueError(
            f"the command line names the app ({parsed.app}) and run file {path} a superlink: give the superlink on "
            "the command line too, or take the app from the file"
        )
    if any(value.endswith(".toml") for value in parsed.run_config or ()):
        raise ValueError(
            f"--config {path} and -c FILE.toml: flwr run takes a TOML file alone; put its keys under "
            f"[{RUN_CONFIG_TABLE}] in {path}"
        )
    positionals = [] if parsed.app is not None else [run_file.options.get("app", "."), *_superlink(run_file)]
    return [*positionals, *_run_config_arguments(run_config, path), *tokens]


def _superlink(run_file: RunFile) -> list[str]:
    return [run_file.options["superlink"]] if "superlink" in run_file.options else []


def _string_option(path: Path) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(f"run file {path}: '{name}' must be a string, got {value!r}")
        return value

    return check


def _flwr_run_positionals(tokens: list[str]) -> argparse.Namespace:
    """The app and superlink the command line names (None where it names none), and its `-c` values."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("app", nargs="?")
    parser.add_argument("superlink", nargs="?")
    parser.add_argument("-c", "--run-config", action="append")
    parser.add_argument("--federation")
    parser.add_argument("--federation-config", action="append")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--format")
    parser.add_argument("--ray-address")  # fedbayes run's own option, whose value is no positional
    parsed, _ = parser.parse_known_args(tokens)
    return parsed


def _run_config_arguments(run_config: Mapping[str, Any], path: Path) -> list[str]:
    """`-c 'key=value ...'` in flwr run's syntax (TOML values), or nothing for an empty run config."""
    quoted = [name for name, value in run_config.items() if isinstance(value, str) and '"' in value]
    if quoted:
        raise ValueError(
            f"run file {path}: [{RUN_CONFIG_TABLE}] '{quoted[0]}' holds a double quote, which flwr run's -c "
            "cannot carry"
        )
    pairs = " ".join(f"{name}={toml_value(value)}" for name, value in run_config.items())
    return ["-c", pairs] if pairs else []
