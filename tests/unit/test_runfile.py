"""Run files (deploy/runfile.py): a `fedbayes local` or `fedbayes run` command as TOML, read as data (bounded,
every option and key checked, the file and the key named, the closest known name suggested), the command line
winning over it; and the workdir's run file a resume reads, which may change only what a resumed federation may."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args

from fedbayes.deploy import cli
from fedbayes.deploy.flwr_run import flwr_run_arguments
from fedbayes.deploy.launcher import LocalRun
from fedbayes.deploy.runfile import (
    MAX_RUN_FILE_BYTES,
    RUN_FILE,
    RunFile,
    check_stored_code,
    flwr_run_argv,
    local_command,
    local_run_config,
    remembered,
    resume_changes,
    run_file_text,
    write_run_file,
)
from fedbayes.server.checkpoint import RESUMABLE_KEYS
from fedbayes.strategies import declared_keys, default_run_config, run_settings
from fedbayes.tasks.config import ConfigError, did_you_mean
from tests.support import ROOT

EXAMPLE = ROOT / "examples" / "run.toml"  # the documented example (docs/running/local.md)


def local_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    cli._add_local(parser)
    return parser


def command(argv: list[str]):
    return local_command(argv, local_parser(), declared_keys())


def parsed(argv: list[str]) -> argparse.Namespace:
    """`fedbayes local ARGV` parsed as the command parses it, its run files spelt out."""
    expanded = command(argv)
    args = cli.build_parser().parse_args(["local", *expanded.argv])
    args.local_command = expanded
    return args


def run_file(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


SMALL = 'strategy = "fedavg"\nclients = 2\nrounds = 1\n'


def test_the_documented_example_parses_into_the_command_and_run_config_it_shows():
    args = parsed(["--config", str(EXAMPLE)])
    assert (args.strategy, args.clients, args.rounds, args.fraction, args.split) == ("fedprox", 4, 5, 0.1, "dirichlet")
    run_config = local_run_config(args.local_command, declared_keys(args.strategy))
    assert run_config == {"proximal-mu": 0.01, "local-epochs": 2, "batch-size": 64, "eval-every": 1}
    run_settings({**default_run_config(args.strategy), "strategy": args.strategy, **run_config})  # a run takes them


def test_the_command_line_wins_over_the_file(tmp_path):
    path = run_file(tmp_path, SMALL + 'split = "dirichlet"\n[run-config]\nlocal-epochs = 2\nlr = 0.01\n')
    args = parsed(["--config", str(path), "--rounds", "3", "--set", "lr=0.1"])
    assert (args.rounds, args.clients, args.split) == (3, 2, "dirichlet")
    assert local_run_config(args.local_command, declared_keys("fedavg")) == {"local-epochs": 2, "lr": 0.01}
    assert args.set == ["lr=0.1"]  # applied after the file's (cli._run_local)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('strategy = "fedavg"\nclient = 2\n', "unknown option 'client' (did you mean 'clients'?)"),
        ("local-epochs = 2\n", "'local-epochs' is a run-config key, not an option: put it under [run-config]"),
        ('clients = "2"\n', "'clients' must be a number, got '2'"),
        ("clients = true\n", "'clients' must be a number, got True"),
        ("clients = 0\n", "'clients' must be >= 1"),
        ("rounds = 2.5\n", "'rounds' must be an integer"),
        ("strategy = 3\n", "'strategy' must be a string, got 3"),
        ('split = "random"\n', "'split' must be one of iid, dirichlet, two-class, got 'random'"),
        ('executor = "threads"\n', "'executor' must be one of shared, fork, subprocess"),
        ("resume = true\n", "unknown option 'resume'"),  # only the command line resumes
        ('run-config = "lr=1"\n', "'run-config' must be a table ([run-config])"),
        ("[run-config]\nhidden = [200, 100]\n", "[run-config] 'hidden' must be a single value"),
        ("clients = \n", "is not TOML: "),
    ],
)
def test_a_bad_option_is_refused_naming_the_file_and_the_option(tmp_path, text, message):
    path = run_file(tmp_path, text)
    with pytest.raises(ValueError, match=r"^run file ") as refused:
        command(["--config", str(path)])
    assert str(refused.value).startswith(f"run file {path}") and message in str(refused.value), refused.value


@pytest.mark.parametrize(
    ("run_config", "message"),
    [
        ("local-epoch = 3", "unknown run-config key 'local-epoch' (did you mean 'local-epochs'?)"),
        ("proximal-muu = 0.1", "unknown run-config key 'proximal-muu' (did you mean 'proximal-mu'?)"),
        ("zzzz = 1", "unknown run-config key 'zzzz'"),
        ('lr = "fast"', "run config 'lr' must be float, got 'fast'"),
        ("batch-size = 0", "run config 'batch-size' must be >= 1"),
    ],
)
def test_a_bad_run_config_key_is_refused_naming_the_file_and_the_closest_key(tmp_path, run_config, message):
    path = run_file(tmp_path, f"{SMALL}[run-config]\n{run_config}\n")
    args = parsed(["--config", str(path)])
    with pytest.raises(ConfigError) as refused:
        local_run_config(args.local_command, declared_keys(args.strategy))
    assert str(refused.value).startswith(f"run file {path}: [run-config] ") and message in str(refused.value)
    if "zzzz" in run_config:
        assert "did you mean" not in str(refused.value)


def test_a_file_over_the_bound_is_refused_before_it_is_read(tmp_path):
    path = run_file(tmp_path, SMALL + "# " + "x" * MAX_RUN_FILE_BYTES + "\n")
    with pytest.raises(ValueError, match=rf"is \d+ bytes, over the {MAX_RUN_FILE_BYTES} bytes a run file may take"):
        command(["--config", str(path)])


def test_a_missing_or_binary_file_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"run file .*nope.toml: cannot read it \(No such file or directory\)"):
        command(["--config", str(tmp_path / "nope.toml")])
    binary = tmp_path / "data.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="is not UTF-8 text"):
        command(["--config", str(binary)])


def test_did_you_mean_names_the_closest_key_and_nothing_when_none_is_close():
    keys = declared_keys()
    assert did_you_mean("local-epoch", keys) == " (did you mean 'local-epochs'?)"
    assert did_you_mean("batchsize", keys) == " (did you mean 'batch-size'?)"
    assert did_you_mean("qqqqqqqq", keys) == ""


def test_set_and_flwr_run_c_keys_are_refused_with_the_closest_key():
    """--set and `flwr run -c` reach RunSettings.from_run_config, on both sides of a federation."""
    with pytest.raises(ConfigError, match=r"unknown run-config key 'local-epoch' \(did you mean 'local-epochs'\?\)"):
        run_settings({**default_run_config(), "local-epoch": 3})
    with pytest.raises(ConfigError, match=r"keys 'local-epoch' \(did you mean 'local-epochs'\?\), 'zzzz';"):
        run_settings({**default_run_config(), "local-epoch": 3, "zzzz": 1})


# ---- the workdir's run file and the resume ---------------------------------------------------------------------
def spec(tmp_path: Path, **changes) -> LocalRun:
    values = {
        "strategy": "fedavg",
        "clients": 2,
        "rounds": 2,
        "fraction": 0.05,
        "workdir": tmp_path / "fed",
        "overrides": {"local-epochs": 2, "data-root": "/data"},
        "parallel_tasks": 1,
    }
    return LocalRun(**{**values, **changes})


def test_the_workdir_run_file_is_a_run_file_that_gives_the_same_run_back(tmp_path):
    workdir = tmp_path / "fed"
    workdir.mkdir()
    (workdir / "flwr-home").mkdir()
    original = spec(tmp_path, results=tmp_path / "rows.jsonl")
    written = write_run_file(workdir, original)
    assert written == workdir / RUN_FILE and tomllib.loads(written.read_text())["rounds"] == 2
    args = parsed(["--resume", str(workdir)])
    assert args.local_command.stored.path == workdir / RUN_FILE
    assert (args.strategy, args.clients, args.rounds, args.fraction, args.parallel_tasks) == ("fedavg", 2, 2, 0.05, 1)
    assert args.results == tmp_path / "rows.jsonl" and args.resume == str(workdir)
    assert local_run_config(args.local_command, declared_keys("fedavg")) == original.overrides
    assert remembered(spec(tmp_path, results=tmp_path / "rows.jsonl")) == RunFile(
        Path(RUN_FILE), args.local_command.stored.options, args.local_command.stored.run_config
    )
    old_style = parsed(["--workdir", str(workdir), "--resume"])  # the command line before run files
    assert old_style.local_command.stored.path == workdir / RUN_FILE and old_style.rounds == 2


def test_a_run_file_the_workdir_holds_that_is_not_ours_is_never_overwritten(tmp_path):
    workdir = tmp_path / "fed"
    workdir.mkdir()
    mine = run_file(workdir, SMALL, RUN_FILE)
    assert write_run_file(workdir, spec(tmp_path)) is None
    assert mine.read_text() == SMALL
    ours = tmp_path / "ours"
    ours.mkdir()
    write_run_file(ours, spec(tmp_path))
    write_run_file(ours, spec(tmp_path, rounds=5))  # a resume that trains longer updates it
    assert tomllib.loads((ours / RUN_FILE).read_text())["rounds"] == 5


def test_a_resume_may_change_what_a_resumed_federation_may_and_says_so(tmp_path):
    stored = remembered(spec(tmp_path))
    defaults = default_run_config("fedavg")
    assert resume_changes(stored, spec(tmp_path), defaults, RESUMABLE_KEYS) == []
    changed = spec(tmp_path, rounds=5, executor="fork", overrides={**stored.run_config, "eval-every": 1})
    assert resume_changes(stored, changed, defaults, RESUMABLE_KEYS) == [
        "executor 'fork' (was 'shared')",
        "rounds 5 (was 2)",
        "run config eval-every 1 (was 0)",
    ]
    explicit_default = spec(tmp_path, overrides={**stored.run_config, "lr": 0.001})  # lr's default, now given
    assert resume_changes(stored, explicit_default, defaults, RESUMABLE_KEYS) == []


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"strategy": "fedprox"}, "strategy 'fedprox' (was 'fedavg')"),
        ({"clients": 3}, "clients 3 (was 2)"),
        ({"seed": 1}, "seed 1 (was 0)"),
        ({"overrides": {"local-epochs": 3, "data-root": "/data"}}, "run config local-epochs 3 (was 2)"),
        ({"overrides": {"local-epochs": 2, "data-root": "/data", "lr": 0.1}}, "run config lr 0.1 (was 0.001)"),
    ],
)
def test_a_resume_that_would_make_another_federation_is_refused_naming_the_change(tmp_path, changes, named):
    stored = remembered(spec(tmp_path))
    with pytest.raises(ValueError, match=r"^--resume: run.toml says how this federation was started") as refused:
        resume_changes(stored, spec(tmp_path, **changes), default_run_config("fedavg"), RESUMABLE_KEYS)
    assert named in str(refused.value) and "another --workdir" in str(refused.value)


def test_a_resume_names_one_workdir(tmp_path):
    with pytest.raises(ValueError, match="--resume a and --workdir b name two workdirs"):
        command(["--resume", "a", "--workdir", "b"])
    with pytest.raises(ValueError, match="--resume needs the workdir of the federation to resume"):
        command(["--resume"])


def test_code_a_workdir_run_file_names_is_run_only_when_the_command_names_it(tmp_path):
    stored = RunFile(tmp_path / RUN_FILE, {"strategy": "mymodule:Mine"}, {"model": "mlp"})
    with pytest.raises(ValueError, match=r"names strategy 'mymodule:Mine', code .* --strategy mymodule:Mine"):
        check_stored_code(stored, None, None)
    check_stored_code(stored, "mymodule:Mine", None)
    model = RunFile(tmp_path / RUN_FILE, {"strategy": "fedavg"}, {"model": "mine:build"})
    with pytest.raises(ValueError, match=r"--set model=mine:build"):
        check_stored_code(model, None, None)
    check_stored_code(model, None, "mine:build")
    check_stored_code(RunFile(tmp_path / RUN_FILE, {"strategy": "fedavg"}), None, None)  # built-in: nothing to name


def test_the_workdir_run_file_text_is_toml_with_every_value_typed(tmp_path):
    text = run_file_text(remembered(spec(tmp_path, overrides={"hidden": "100", "download": True, "lr": 0.5})))
    document = tomllib.loads(text)
    assert document["run-config"] == {"hidden": "100", "download": True, "lr": 0.5}
    assert document["fraction"] == 0.05 and document["parallel-tasks"] == 1 and "results" not in document


# ---- fedbayes run --------------------------------------------------------------------------------------------------
def test_fedbayes_run_without_a_run_file_passes_its_arguments_as_they_are():
    argv = [".", "local", "-c", "lr=0.1", "--stream"]
    assert flwr_run_argv(argv, declared_keys) == argv


def test_fedbayes_run_spells_out_its_run_file_as_flwr_run_arguments(tmp_path):
    path = run_file(
        tmp_path,
        'app = "myapp"\nsuperlink = "local"\n[run-config]\nstrategy = "bayesadmm"\nrho = 1\nhidden = "100"\n'
        'download = true\ntracking = "tensorboard:/tmp/a b"\n',
    )
    argv = flwr_run_argv(["--config", str(path), "-c", "rho=0.5"], declared_keys)
    assert argv[:3] == ["myapp", "local", "-c"] and argv[4:] == ["-c", "rho=0.5"]
    # as Flower reads them: the file's values typed as the file typed them (rho: the float the key declares), and
    # the command line's -c winning
    assert parse_config_args(argv[3:4]) == {
        "strategy": "bayesadmm",
        "rho": 1.0,
        "hidden": "100",
        "download": True,
        "tracking": "tensorboard:/tmp/a b",
    }
    assert parse_config_args([argv[3], argv[5]])["rho"] == 0.5
    named = flwr_run_arguments(flwr_run_argv([f"--config={path}", "other", "remote"], declared_keys))
    assert (named.app, named.superlink) == ("other", "remote")  # the command line's, not the file's


@pytest.mark.parametrize(
    ("text", "argv", "message"),
    [
        ("[run-config]\nlocal-epoch = 2\n", [], "unknown run-config key 'local-epoch' (did you mean 'local-epochs'?)"),
        ('[run-config]\nstrategy = "bayesadmm"\nrhoo = 1\n', [], "'rhoo' (did you mean 'rho'?)"),
        ('sperlink = "local"\n', [], "unknown option 'sperlink' (did you mean 'superlink'?)"),
        ("app = 1\n", [], "'app' must be a string, got 1"),
        ('superlink = "local"\n', ["myapp"], "names the app (myapp) and run file"),
        ("[run-config]\nlr = 0.1\n", ["-c", "more.toml"], "flwr run takes a TOML file alone"),
        ('[run-config]\nhidden = "1\\"0"\n', [], "'hidden' holds a double quote"),
    ],
)
def test_fedbayes_run_refuses_a_bad_run_file_before_flwr_starts(tmp_path, text, argv, message):
    path = run_file(tmp_path, text)
    with pytest.raises(ValueError) as refused:
        flwr_run_argv(["--config", str(path), *argv], declared_keys)
    assert message in str(refused.value), refused.value


def test_the_documented_simulation_run_file_spells_out_as_the_readme_command_does():
    argv = flwr_run_argv(["--config", str(ROOT / "examples" / "simulation.toml"), "--stream"], declared_keys)
    named = flwr_run_arguments(argv)
    assert (named.app, named.superlink, named.stream) == (".", "local", True)
    assert parse_config_args(named.run_config) == {
        "num-server-rounds": 5,
        "fraction": 0.1,
        "results-exists": "replace",
    }


def test_resume_alone_says_why_a_workdir_without_a_run_file_cannot_be_resumed(tmp_path):
    with pytest.raises(ValueError, match=r"^--resume: .*nothing holds no federation to resume \(no flwr-home/ in it\)"):
        command(["--resume", str(tmp_path / "nothing")])
    (tmp_path / "old" / "flwr-home").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"holds no run.toml \(a federation started before fedbayes wrote run files"):
        command(["--resume", str(tmp_path / "old")])
    whole = command([*"--strategy fedavg --clients 2 --rounds 1 --workdir".split(), str(tmp_path / "old"), "--resume"])
    assert whole.stored is None and "--resume" in whole.argv  # the command line it was started with still resumes it
