"""Protocol presets: the run-config values with which a source paper ran its experiments, per strategy and split.

`fedbayes local --preset NAME` starts from them (every `--set` still wins), `fedbayes presets` lists them with the
source of each value and prints them as a `-c` string for `fedbayes run` and compose. A paper's numbers and ours are
comparable only under the same protocol: the BayesADMM authors' code, for one, feeds raw 0-255 pixels to every
method, which our defaults never do.

The presets are data, deploy/presets.toml (shipped with the package; its header describes the format): each value with
its source, each preset with its paper, results and section, and what a paper does that no run-config key can express
(`Preset.unmatched`). Reading it refuses, naming the file and the key, anything it does not know.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from fedbayes.tasks.config import ConfigError


@dataclass(frozen=True)
class Setting:
    """One run-config value and where it comes from. `value` may be a function of the number of clients."""

    value: Any | Callable[[int], Any]
    source: str

    def resolve(self, clients: int) -> Any:
        """The value for `clients` clients.

        Args:
            clients: the federation's number of clients.

        Returns:
            The value, computed from `clients` where it depends on them.
        """
        return self.value(clients) if callable(self.value) else self.value


@dataclass(frozen=True)
class Preset:
    """A paper's protocol: where it comes from (`paper`, the `results` it reproduces, the `section` that describes
    them), the splits it describes and the data it ran on (`dataset`, `fraction`, `clients`, `rounds`: what `fedbayes
    local` takes when not told otherwise), the keys every strategy gets, each strategy's own (a (strategy, split)
    entry wins over the strategy's), and what no key can express."""

    name: str
    paper: str
    results: str
    section: str
    splits: tuple[str, ...]
    dataset: str
    fraction: float
    clients: int
    rounds: int
    common: Mapping[str, Setting]
    strategies: Mapping[str, Mapping[str, Setting]]
    by_split: Mapping[tuple[str, str], Mapping[str, Setting]] = field(default_factory=dict)
    unmatched: tuple[str, ...] = ()

    @property
    def source(self) -> str:
        """The paper, the results and the section, in one line."""
        return f"{self.paper}, {self.results}, {self.section}"

    def settings(self, strategy: str, split: str) -> dict[str, Setting]:
        """Every key this preset sets for `strategy` on `split`, with its source.

        Args:
            strategy: a strategy the preset covers.
            split: a split the paper ran.

        Returns:
            The settings by run-config key: the common ones, the strategy's, then the strategy's for `split`.

        Raises:
            ConfigError: a strategy the preset does not cover, or a split the paper did not run (there is no protocol
                to follow).
        """
        if split not in self.splits:
            raise ConfigError(f"preset {self.name!r} describes the splits {', '.join(self.splits)}, not {split!r}")
        if strategy not in self.strategies:
            raise ConfigError(
                f"preset {self.name!r} has no settings for strategy {strategy!r}: it covers "
                f"{', '.join(self.strategies)} ({self.paper})"
            )
        return {**self.common, **self.strategies[strategy], **self.by_split.get((strategy, split), {})}

    def run_config(self, strategy: str, split: str, clients: int) -> dict[str, Any]:
        """The run-config values for `strategy` on `split` with `clients` clients.

        Args:
            strategy: a strategy the preset covers.
            split: a split the paper ran.
            clients: the federation's number of clients.

        Returns:
            The values by run-config key.

        Raises:
            ConfigError: as `settings`.
        """
        return {key: setting.resolve(clients) for key, setting in self.settings(strategy, split).items()}


@dataclass(frozen=True)
class PresetFile:
    """What a presets file holds: the sources its settings cite, by label, and the presets by name."""

    references: Mapping[str, str]
    presets: Mapping[str, Preset]


# The keys of a preset's table and the type of each; the first eight are required.
PRESET_FIELDS: dict[str, type | tuple[type, ...]] = {
    "paper": str,
    "results": str,
    "section": str,
    "splits": list,
    "dataset": str,
    "fraction": (int, float),
    "clients": int,
    "rounds": int,
    "common": dict,
    "strategies": dict,
    "by-split": dict,
    "unmatched": list,
    "unmatched-with": list,
}
REQUIRED_FIELDS = tuple(PRESET_FIELDS)[:8]
VALUE_KINDS = ("value", "divided-by-clients", "epochs-for-steps")
EPOCHS_FOR_STEPS = ("steps", "batch", "examples")


def divided_by_clients(numerator: float, clients: int) -> float:
    """`numerator` / `clients` (a share of the clients, as one client a round).

    Args:
        numerator: the value for one client.
        clients: the federation's clients, at least 1.

    Returns:
        The quotient.
    """
    return numerator / clients


def epochs_for_steps(steps: int, batch: int, examples: int, clients: int) -> int:
    """`steps` steps of `batch` examples, on one of `clients` clients sharing `examples`, in whole epochs (at least
    one).

    Args:
        steps: the local steps to match.
        batch: the minibatch size.
        examples: the training examples of all the clients together.
        clients: the federation's clients.

    Returns:
        steps x batch x clients / examples, rounded, at least 1.
    """
    return max(1, round(steps * batch * clients / examples))


class _Reader:
    """Reads one presets file, naming it and the key in every refusal."""

    def __init__(self, name: str, document: dict[str, Any]):
        from fedbayes.strategies import declared_keys

        self.name, self.document, self.run_config_keys = name, document, declared_keys()
        self.sets: dict[str, dict[str, Setting]] = {}  # the named settings sets read so far

    def refuse(self, where: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.name}: {where}: {problem}")

    def known(self, key: str, among: Mapping[str, Any] | tuple[str, ...], where: str) -> None:
        if key not in among:
            raise self.refuse(f"{where}.{key}" if where else key, f"unknown key (known: {', '.join(among)})")

    def only_known(self, table: Mapping[str, Any], among: Mapping[str, Any] | tuple[str, ...], where: str) -> None:
        for key in table:
            self.known(key, among, where)

    def named(self, kind: str, name: str, where: str) -> Any:
        """The entry `name` of the top-level table `kind` (settings, notes), which `where` names."""
        entries = self.typed(self.document.get(kind, {}), dict, kind)
        if name not in entries:
            raise self.refuse(where, f"no {kind}.{name} (there are {', '.join(entries) or 'none'})")
        return entries[name]

    def typed(self, value: Any, kind: type | tuple[type, ...], where: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, kind):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(each.__name__ for each in kind)
            raise self.refuse(where, f"must be {names}, not {value!r}")
        return value

    def strings(self, value: Any, where: str) -> tuple[str, ...]:
        return tuple(self.typed(each, str, f"{where}[{i}]") for i, each in enumerate(self.typed(value, list, where)))

    def read(self) -> PresetFile:
        self.only_known(self.document, ("references", "settings", "notes", "presets"), "")
        references = {
            label: self.typed(text, str, f"references.{label}")
            for label, text in self.typed(self.document.get("references", {}), dict, "references").items()
        }
        presets = {
            name: self.preset(name, self.typed(table, dict, f"presets.{name}"))
            for name, table in self.typed(self.document.get("presets", {}), dict, "presets").items()
        }
        return PresetFile(references, presets)

    def preset(self, name: str, table: dict[str, Any]) -> Preset:
        where = f"presets.{name}"
        self.only_known(table, PRESET_FIELDS, where)
        for key, kind in PRESET_FIELDS.items():
            if key in table:
                self.typed(table[key], kind, f"{where}.{key}")
            elif key in REQUIRED_FIELDS:
                raise self.refuse(f"{where}.{key}", "missing")
        splits = self.strings(table["splits"], f"{where}.splits")
        strategies = {
            strategy: self.settings(
                self.typed(own, dict, f"{where}.strategies.{strategy}"), f"{where}.strategies.{strategy}"
            )
            for strategy, own in table.get("strategies", {}).items()
        }
        by_split: dict[tuple[str, str], dict[str, Setting]] = {}
        for strategy, per_split in table.get("by-split", {}).items():
            self.known(strategy, strategies, f"{where}.by-split")
            self.only_known(
                self.typed(per_split, dict, f"{where}.by-split.{strategy}"), splits, f"{where}.by-split.{strategy}"
            )
            for split, own in per_split.items():
                at = f"{where}.by-split.{strategy}.{split}"
                by_split[strategy, split] = self.settings(self.typed(own, dict, at), at)
        unmatched = self.strings(table.get("unmatched", []), f"{where}.unmatched")
        for note in self.strings(table.get("unmatched-with", []), f"{where}.unmatched-with"):
            unmatched += self.strings(self.named("notes", note, f"{where}.unmatched-with"), f"notes.{note}")
        return Preset(
            name=name,
            paper=table["paper"],
            results=table["results"],
            section=table["section"],
            splits=splits,
            dataset=table["dataset"],
            fraction=float(table["fraction"]),
            clients=table["clients"],
            rounds=table["rounds"],
            common=self.settings(table.get("common", {}), f"{where}.common"),
            strategies=strategies,
            by_split=by_split,
            unmatched=unmatched,
        )

    def settings(self, table: dict[str, Any], where: str, within: tuple[str, ...] = ()) -> dict[str, Setting]:
        """A settings table: the named sets it takes `with`, in order, then its own keys (which win)."""
        result: dict[str, Setting] = {}
        for name in self.strings(table.get("with", []), f"{where}.with"):
            result.update(self.named_set(name, f"{where}.with", within))
        for key, entry in table.items():
            if key == "with":
                continue
            if key not in self.run_config_keys:
                raise self.refuse(f"{where}.{key}", "not a run-config key (`fedbayes strategies` lists them)")
            result[key] = self.setting(self.typed(entry, dict, f"{where}.{key}"), f"{where}.{key}")
        return result

    def named_set(self, name: str, where: str, within: tuple[str, ...]) -> dict[str, Setting]:
        table = self.typed(self.named("settings", name, where), dict, f"settings.{name}")
        if name in within:
            raise self.refuse(f"settings.{name}", f"takes itself: {' -> '.join((*within, name))}")
        if name not in self.sets:
            self.sets[name] = self.settings(table, f"settings.{name}", (*within, name))
        return self.sets[name]

    def setting(self, entry: dict[str, Any], where: str) -> Setting:
        self.only_known(entry, ("source", *VALUE_KINDS), where)
        kinds = [kind for kind in VALUE_KINDS if kind in entry]
        if len(kinds) != 1:
            raise self.refuse(where, f"needs exactly one of {', '.join(VALUE_KINDS)}")
        source = self.typed(entry.get("source"), str, f"{where}.source")
        value = entry[kinds[0]]
        if kinds[0] == "divided-by-clients":
            value = functools.partial(divided_by_clients, float(self.typed(value, (int, float), f"{where}.{kinds[0]}")))
        elif kinds[0] == "epochs-for-steps":
            at = f"{where}.{kinds[0]}"
            self.only_known(self.typed(value, dict, at), EPOCHS_FOR_STEPS, at)
            counts = [self.typed(value.get(key), int, f"{at}.{key}") for key in EPOCHS_FOR_STEPS]
            value = functools.partial(epochs_for_steps, *counts)
        return Setting(value, source)


def load_presets(path: Traversable) -> PresetFile:
    """Read and check a presets file (the format: deploy/presets.toml's header).

    Args:
        path: the TOML file.

    Returns:
        Its references and presets.

    Raises:
        ConfigError: the file is not TOML, or holds a key it may not (one the format does not know, a setting that is
            not a run-config key, a named set or note that does not exist), a value of the wrong type, or misses a
            preset's required key; the message names the file and the key.
    """
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path}: not TOML: {error}") from error
    return _Reader(str(path), document).read()


PRESET_FILE = load_presets(resources.files("fedbayes.deploy") / "presets.toml")
PRESETS = PRESET_FILE.presets


def get_preset(name: str) -> Preset:
    """The preset called `name`.

    Args:
        name: a preset's name (`fedbayes presets` lists them).

    Returns:
        The preset.

    Raises:
        ConfigError: no preset has that name; the message lists them.
    """
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}: one of {', '.join(PRESETS)} (`fedbayes presets`)")
    return PRESETS[name]


def describe(name: str = "", strategy: str = "", split: str = "", clients: int = 0) -> str:
    """`fedbayes presets`: every preset in a line; one preset's values, each with its source; or, given a strategy,
    its values as a `-c` string for `fedbayes run` (`flwr run`) and compose.

    Args:
        name: the preset; "" lists them all.
        strategy: one strategy of the preset; "" shows every one (and no `-c` string).
        split: the split; "" is the preset's first.
        clients: the number of clients the values are for; 0 is the preset's.

    Returns:
        The text to print.

    Raises:
        ConfigError: an unknown preset, or a strategy or split it does not cover.
    """
    from fedbayes.deploy.flower_app import toml_value

    if not name:
        return "\n".join(
            f"{preset.name}: {preset.source}\n  {preset.dataset}, fraction {preset.fraction}, "
            f"{preset.clients} clients, {preset.rounds} rounds, splits {', '.join(preset.splits)}; "
            f"strategies {', '.join(preset.strategies)}"
            for preset in PRESETS.values()
        )
    preset = get_preset(name)
    split = split or preset.splits[0]
    lines = [
        f"{preset.name}: {preset.source}",
        f"  {preset.dataset}, fraction {preset.fraction}, {preset.clients} clients, {preset.rounds} rounds",
    ]
    for each in [strategy] if strategy else list(preset.strategies):
        lines.append(f"{each} ({split}):")
        values = preset.settings(each, split)
        lines += [
            f"  {key} = {toml_value(setting.resolve(clients or preset.clients))}  # {setting.source}"
            for key, setting in values.items()
        ]
    if strategy:
        config = {
            "strategy": strategy,
            "split": split,
            "dataset": preset.dataset,
            "fraction": preset.fraction,
            **preset.run_config(strategy, split, clients or preset.clients),
        }
        lines.append(
            "as `fedbayes run ... -c`: " + " ".join(f"{key}={toml_value(value)}" for key, value in config.items())
        )
    lines.append("not expressed by any key:")
    lines += [f"  - {difference}" for difference in preset.unmatched]
    return "\n".join(lines)
