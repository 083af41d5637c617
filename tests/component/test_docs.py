"""The documentation: the site builds with `mkdocs build --strict`, the generated configuration reference
is what the declared keys give, every `fedbayes ...` command shown in the docs and the READMEs parses (argparse and
Flower's `flwr run` parser, without running anything), every run-config key they name is declared, the algorithm
pages name every hyperparameter, and the public API's docstring examples run."""

from __future__ import annotations

import argparse
import doctest
import importlib
import importlib.util
import inspect
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path
from unittest import mock

import pytest

from fedbayes.client.runtime import NodeSettings
from fedbayes.deploy import cli
from fedbayes.deploy.flwr_run import flwr_run_arguments, split_ray_address
from fedbayes.deploy.runfile import flwr_run_argv
from fedbayes.strategies import declared_keys, get_algorithm

ROOT = next(folder for folder in Path(__file__).resolve().parents if (folder / "mkdocs.yml").is_file())
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(DOCS.rglob("*.md")) + [README, ROOT / "deploy" / "README.md", ROOT / "deploy" / "CLIENT.md"]
README_LINES = 150  # install, demo, tests, deploy, results, strategy choice, posterior, forget, extending

# Keys that are not run config but appear as key=value in the pages: a SuperNode's node config
# (fedbayes.client.runtime.NodeSettings.from_node_config reads them; checked below) and Flower's federation config
# of a simulation (`--federation-config`).
NODE_CONFIG_KEYS = ("partition-id", "num-partitions", "data-path", "state-dir", "client-id", "device")
FEDERATION_CONFIG_KEYS = ("num-supernodes", "client-resources-num-cpus", "client-resources-num-gpus")
# The modules whose docstring examples CI runs (the public API the docs render).
DOCTEST_MODULES = (
    "fedbayes.strategies",
    "fedbayes.tasks.config",
    "fedbayes.protos.codec",
    "fedbayes.posterior.uncertainty",
    "fedbayes.bayes.metrics",
)
# The algorithm page of each strategy's hyperparameters.
ALGORITHM_PAGES = {
    "fedprox": "fedavg.md",
    "bayesadmm": "bayesadmm.md",
    "feddyn": "feddyn.md",
    "fedlap": "fedlap.md",
    "fedlap-func": "fedlap-func.md",
    "fedpa": "fedpa.md",
    "dsvgd": "dsvgd.md",
}


@pytest.fixture(autouse=True)
def in_the_checkout(monkeypatch):
    """The pages' commands run from the checkout's root: the run files they name (examples/) are read from there."""
    monkeypatch.chdir(ROOT)


# ---- reading the pages ---------------------------------------------------------------------------------------
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
SEPARATORS = {"|", "||", "&&", ";", "&"}


def fenced_blocks(text: str, languages: tuple[str, ...]) -> list[str]:
    blocks = []
    for match in FENCE.finditer(text):
        if match["info"] in languages:
            indent = len(match["indent"])
            blocks.append("\n".join(line[indent:] for line in match["body"].splitlines()))
    return blocks


def prose(text: str) -> str:
    """The page without its fenced blocks."""
    return FENCE.sub("", text)


def shell_commands(block: str) -> list[list[str]]:
    """The commands of a shell block: continued lines joined, comments dropped, split at | && ; &."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in [*words, ";"]:
            if word in SEPARATORS:
                if command:
                    commands.append(command)
                command = []
            else:
                command.append(word)
    return commands


def subcommands() -> set[str]:
    parser = capture_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(action.choices)


def fedbayes_invocations(command: list[str], names: set[str]) -> list[list[str]]:
    """`fedbayes SUBCOMMAND ...` inside a command (after environment assignments, in `docker run IMAGE fedbayes ...`
    or `~/venv/bin/fedbayes ...`): its arguments, from the subcommand on."""
    return [
        command[index + 1 :]
        for index, word in enumerate(command[:-1])
        if (word == "fedbayes" or word.endswith("/fedbayes")) and command[index + 1] in names
    ]


def documented_invocations() -> list[tuple[str, list[str]]]:
    """Every `fedbayes` command of the pages' shell blocks (running text names commands and options, it shows none
    whole), with the page it is on."""
    names = subcommands()
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in fenced_blocks(text, ("sh", "bash", "shell")):
            for command in shell_commands(block):
                found += [(page.relative_to(ROOT).as_posix(), argv) for argv in fedbayes_invocations(command, names)]
    return found


# ---- parsing without running -----------------------------------------------------------------------------------
class Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace | None = None) -> None:
        super().__init__()
        self.parser, self.namespace = parser, namespace


def capture_parser() -> argparse.ArgumentParser:
    """The `fedbayes` parser, as fedbayes.deploy.cli.main parses every command but `run` and `supernode` with it."""
    return cli.build_parser()


def dry_parse(argv: list[str]) -> argparse.Namespace | dict:
    """Parse `fedbayes ARGV` as the command would, and run nothing. SystemExit (argparse) or click's UsageError
    (flwr run) when it does not parse."""
    if argv[0] == "run":  # fedbayes hands these to `flwr run` (a --config run file spelt out): its reading, Flower's
        arguments = split_ray_address(flwr_run_argv(argv[1:], declared_keys))[1]
        flwr_run_arguments(arguments)
        return flower_run_parse(arguments)
    if argv[0] == "supernode":
        raise AssertionError("no dry parse for `fedbayes supernode` (flower-supernode's arguments): add one")
    original = argparse.ArgumentParser.parse_args

    def parse(parser, args=None, namespace=None):
        raise Parsed(parser, original(parser, args, namespace))

    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse):
        try:
            cli.main(argv)
        except Parsed as parsed:
            return parsed.namespace
    raise AssertionError(f"fedbayes {shlex.join(argv)} ran without parsing its arguments")


def flower_run_parse(args: list[str]) -> dict:
    """`flwr run ARGS` as Flower 1.39's command line reads them (click), without running it."""
    import typer
    from flwr.cli.app import app

    return typer.main.get_command(app).commands["run"].make_context("run", list(args)).params


def run_config_overrides(argv: list[str], namespace) -> dict[str, object]:
    """The run-config keys a parsed command sets: `--set KEY=VALUE` (fedbayes local), `-c '...'` (fedbayes run)."""
    from flwr.common.config import parse_config_args

    if argv[0] == "run":
        return parse_config_args(list(namespace["run_config_overrides"] or ()))
    return dict(item.split("=", 1) for item in getattr(namespace, "set", []) or [])


# ---- the tests ---------------------------------------------------------------------------------------------------
def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_builds_strictly_with_every_page_and_the_api_reference(tmp_path):
    built = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    configuration = (tmp_path / "site" / "reference" / "configuration" / "index.html").read_text()
    assert all(f"<code>{name}</code>" in configuration for name in declared_keys())
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    for identifier in (
        "fedbayes.strategies.base.ServerStrategy",
        "fedbayes.protos.codec.decode",
        "fedbayes.posterior.load",
        "fedbayes.client.core.ClientHalf",
    ):
        assert f'id="{identifier}"' in api, identifier
    assert (tmp_path / "site" / "assets" / "benchmarks" / "table1" / "table1-seed0.png").is_file()


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The build above passing means something: the same site with one link to a missing page does not build."""
    for name in ("fedbayes", "benchmarks", "tests", "examples", "pyproject.toml", "CHANGELOG.md"):
        (tmp_path / name).symlink_to(ROOT / name)
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    page = tmp_path / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [the missing page](running/no-such-page.md).\n")
    built = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "no-such-page.md" in built.stdout + built.stderr


def test_the_configuration_reference_and_the_presets_page_are_generated_from_the_code():
    spec = importlib.util.spec_from_file_location("gen_config", DOCS / "gen_config.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert generator.PAGE.read_text() == generator.render(), "stale: run `python docs/gen_config.py` (make docs)"
    assert generator.PRESETS_PAGE.read_text() == generator.render_presets(), "stale: run `python docs/gen_config.py`"
    assert generator.main(["--check"]) == 0


def test_the_readme_is_short_and_keeps_the_test_command():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_LINES, f"README.md has {len(lines)} lines, over {README_LINES}"
    assert ["make test"] in [block.strip().splitlines() for block in fenced_blocks(README.read_text(), ("sh",))]


def test_the_simulation_command_is_the_same_in_the_readme_and_the_docs():
    """tests/test_simulation.py runs the README's; the docs page must show that one."""

    def command_after(text: str, heading: str) -> str:
        text = "\n" + text
        return fenced_blocks(text[text.index(f"\n{heading}\n") :], ("sh",))[0]

    readme = command_after(README.read_text(), "### Simulation (Ray, many virtual clients)")
    docs = command_after((DOCS / "running" / "simulation.md").read_text(), "# Simulation: many virtual clients")
    assert "fedbayes run " in readme and readme == docs


def test_every_fedbayes_command_in_the_docs_parses():
    invocations = documented_invocations()
    assert len(invocations) >= 40, "the pages' commands were not found"
    assert {argv[0] for _, argv in invocations} >= {
        "local",
        "run",
        "client",
        "pki",
        "forget",
        "export",
        "predict",
        "report",
        "partitions",
        "export-partitions",
    }
    failures = []
    for page, argv in invocations:
        try:
            dry_parse(argv)
        except (SystemExit, Exception) as error:  # argparse exits 2; click raises UsageError
            failures.append(f"{page}: fedbayes {shlex.join(argv)}: {type(error).__name__} {error}")
    assert not failures, "\n".join(failures)


def test_a_command_that_does_not_parse_is_caught(capsys):
    assert dry_parse(["local", "--strategy", "fedavg", "--clients", "3", "--rounds", "2"]).rounds == 2
    with pytest.raises(SystemExit):
        dry_parse(["local", "--strategy", "fedavg", "--clients", "3"])  # --rounds is required
    assert "--rounds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        dry_parse(["run", ".", "local", "--no-such-option"])  # fedbayes' reading of flwr run's arguments
    with pytest.raises(Exception, match="No such option"):
        flower_run_parse([".", "local", "--no-such-option"])  # Flower's


def test_every_run_config_key_the_docs_name_is_declared():
    keys = set(declared_keys())
    source = inspect.getsource(NodeSettings.from_node_config)
    assert all(f'"{key}"' in source for key in NODE_CONFIG_KEYS), "NODE_CONFIG_KEYS is not what the client reads"
    other = {*NODE_CONFIG_KEYS, *FEDERATION_CONFIG_KEYS}
    named: list[tuple[str, str]] = []
    for page, argv in documented_invocations():  # --set KEY=VALUE and -c '...' of fedbayes commands
        named += [(page, key) for key in run_config_overrides(argv, dry_parse(argv))]
    for page in PAGES:
        text, where = page.read_text(), page.relative_to(ROOT).as_posix()
        for block in fenced_blocks(text, ("sh", "bash", "shell")):  # --set of the benchmarks' commands
            named += [(where, key) for key in re.findall(r"--set[ =]([a-z][a-z0-9-]*)=", block)]
        for span in INLINE_CODE.findall(prose(text)):  # `key=value` and `key = value` in running text
            if match := re.fullmatch(r"([a-z][a-z0-9-]*) ?= ?[^=\s].*", span):
                if match[1] not in other:
                    named.append((where, match[1]))
    assert len(named) >= 100, "the pages' run-config keys were not found"
    unknown = sorted({f"{page}: {key}" for page, key in named if key not in keys})
    assert not unknown, "run-config keys no strategy declares:\n" + "\n".join(unknown)


SHELL_FILES = ("~/.bashrc", "~/.profile")  # the user's own dotfiles, which a page may tell them to edit


def code_home_locations() -> list[str]:
    """Where under the home directory the code keeps things by default (`~/...`): the server's checkpoints, a
    client's state and Flower's home, asked of the code in a fresh process whose environment overrides none."""
    home = "/nonexistent/home-of-the-test"
    script = (
        "import json; from fedbayes.server.app import DEFAULT_SERVER_STATE_DIR as server; "
        "from fedbayes.client.runtime import DEFAULT_STATE_DIR as client; "
        "from flwr.supercore.utils import get_flwr_home; "
        "print(json.dumps([str(server), str(client), str(get_flwr_home())]))"
    )
    overrides = ("FEDBAYES_SERVER_STATE_DIR", "FEDBAYES_STATE_DIR", "FLWR_HOME")
    env = {name: value for name, value in os.environ.items() if name not in overrides}
    answer = subprocess.run(
        [sys.executable, "-c", script], env={**env, "HOME": home}, capture_output=True, text=True, timeout=300
    )
    assert answer.returncode == 0, answer.stderr
    locations = json.loads(answer.stdout.splitlines()[-1])
    assert all(location.startswith(f"{home}/") for location in locations), locations
    return [location.replace(home, "~", 1) for location in locations]


def test_every_home_directory_path_the_docs_name_is_where_the_code_puts_it():
    """A page that says checkpoints live in `~/.server/<name>` when the code writes `~/.fedbayes/server` sends an
    operator who deletes them to start over to delete nothing."""
    locations = code_home_locations()
    assert "~/.fedbayes/server" in locations, locations
    named = [
        (page.relative_to(ROOT).as_posix(), path)
        for page in PAGES
        for path in re.findall(r"~/\.[A-Za-z0-9_./<>-]*", page.read_text())
    ]
    assert any(path.startswith("~/.fedbayes/server") for _, path in named), "the pages' paths were not found"
    wrong = [
        f"{page}: {path}"
        for page, path in named
        if path not in SHELL_FILES and not any(path == place or path.startswith(f"{place}/") for place in locations)
    ]
    assert not wrong, f"paths no code uses (it uses {', '.join(locations)}):\n" + "\n".join(wrong)


def test_a_page_that_starts_an_mlflow_server_installs_the_full_mlflow_and_waits_for_it():
    """The `mlflow` extra is mlflow-skinny, which has no `mlflow server`; and a server started in the background takes
    minutes to answer on a busy machine, so a run started right after it went untracked."""
    started = []
    for page in PAGES:
        for block in fenced_blocks(page.read_text(), ("sh", "bash", "shell")):
            lines = block.replace("\\\n", " ").splitlines()
            for index, line in enumerate(lines):
                if line.startswith("mlflow server "):
                    started.append(page.name)
                    installs = [shlex.split(other, comments=True) for other in lines if other.startswith("pip install")]
                    assert any("mlflow" in words for words in installs), f"{page.name}: no `pip install mlflow`"
                    assert line.rstrip().endswith("&") and "--workers 1" in line, f"{page.name}: {line}"
                    wait = lines[index + 1]
                    assert wait.startswith("curl ") and "--retry-connrefused" in wait and "/health &&" in wait, wait
    assert started, "no page starts an MLflow server any more"


@pytest.mark.parametrize("strategy", sorted(ALGORITHM_PAGES))
def test_each_algorithm_page_explains_every_hyperparameter(strategy):
    page = (DOCS / "algorithms" / ALGORITHM_PAGES[strategy]).read_text()
    table = page[page.index("## Hyperparameters") :]
    missing = [key.name for key in get_algorithm(strategy).hyperparameters if f"`{key.name}`" not in table]
    assert not missing, f"docs/algorithms/{ALGORITHM_PAGES[strategy]} does not explain {missing}"


@pytest.mark.parametrize("module", DOCTEST_MODULES)
def test_the_public_api_docstring_examples_run(module):
    imported = importlib.import_module(module)
    results = doctest.testmod(imported, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert results.attempted > 0, f"{module} is listed for its docstring examples but has none"
    assert results.failed == 0, f"{module}: {results.failed} of {results.attempted} docstring examples failed"


def test_the_readme_and_deploy_pages_link_to_files_that_exist():
    """mkdocs checks the site's links; these pages are outside it."""
    broken = []
    for page in (README, ROOT / "deploy" / "README.md", ROOT / "deploy" / "CLIENT.md"):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not re.match(r"[a-z]+://", target) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "\n".join(broken)


# A path in a comment or docstring that starts at one of the repository's own folders (a Flower source path, a
# placeholder such as DIR/pyproject.toml or the authors' config files do not).
REPOSITORY_PATH = re.compile(
    r"(?<![\w./-])((?:bayes|benchmarks|client|deploy|docs|posterior|protos|server|strategies|tasks|tests)"
    r"/(?:[\w.-]+/)*[\w-]+\.(?:py|md|proto|toml|yml|yaml|sh|json|jsonl))\b"
)
PACKAGE_FOLDERS = ("bayes", "client", "deploy", "posterior", "protos", "server", "strategies", "tasks")


def repository_paths_in_comments(source: str) -> list[tuple[int, str]]:
    """(line, path) for every repository path named in `source`'s comments and string literals."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            found += [(token.start[0], match.group(1)) for match in REPOSITORY_PATH.finditer(token.string)]
    return found


def test_every_repository_path_named_in_the_code_exists():
    stale = [
        f"{module.relative_to(ROOT)}:{line}: {path}"
        for folder in PACKAGE_FOLDERS
        for module in sorted((ROOT / folder).rglob("*.py"))
        if not module.name.endswith("_pb2.py")
        for line, path in repository_paths_in_comments(module.read_text())
        if not (ROOT / path).exists()
    ]
    assert not stale, "paths that do not exist:\n" + "\n".join(stale)


def test_a_stale_path_in_a_comment_is_found():
    source = '"""Checked in tests/unit/test_config.py and tests/test_gone.py."""\n# see flwr/common/x.py, DIR/a.toml\n'
    assert [path for _, path in repository_paths_in_comments(source)] == [
        "tests/unit/test_config.py",
        "tests/test_gone.py",
    ]
