"""Protocol presets (deploy/presets.toml): every value is a declared run-config key the strategy accepts, `fedbayes
local --preset` starts from them with every --set winning, the `-c` string of `fedbayes presets` reads back as the
same run config under Flower's own parser, and what a preset does not cover is refused before any process starts."""

from __future__ import annotations

import pytest
from flwr.common.config import parse_config_args

from fedbayes.deploy import launcher
from fedbayes.deploy.cli import main
from fedbayes.deploy.presets import PRESETS, describe, get_preset
from fedbayes.strategies import default_run_config, run_settings
from fedbayes.tasks.config import ConfigError

CASES = [
    (preset.name, strategy, split)
    for preset in PRESETS.values()
    for strategy in preset.strategies
    for split in preset.splits
]


@pytest.mark.parametrize(("name", "strategy", "split"), CASES)
def test_every_preset_value_is_a_key_its_strategy_accepts(name, strategy, split):
    preset = get_preset(name)
    values = preset.run_config(strategy, split, preset.clients)
    config = {**default_run_config(strategy), "strategy": strategy, "split": split, **values}
    settings = run_settings(config)  # refuses an unknown key or a value its check rejects, naming it
    for key, value in values.items():
        if hasattr(settings, key.replace("-", "_")):  # a core key: read back typed
            assert getattr(settings, key.replace("-", "_")) == value, key


def test_a_misspelt_key_in_a_preset_would_be_refused():
    config = {**default_run_config("bayesadmm"), "strategy": "bayesadmm", "hess-int": 1e-3}
    with pytest.raises(ConfigError, match="unknown run-config key.*hess-int"):
        run_settings(config)


def test_bayesadmm_paper_follows_the_authors_configs_per_split():
    preset = get_preset("bayesadmm-paper")
    heterogeneous = preset.run_config("bayesadmm", "dirichlet", 10)
    homogeneous = preset.run_config("bayesadmm", "iid", 10)
    assert (heterogeneous["rho"], heterogeneous["prior-precision"], heterogeneous["lr-schedule"]) == (
        0.2,
        1.0,
        "cosine",
    )
    assert (homogeneous["rho"], homogeneous["prior-precision"], homogeneous["lr-schedule"]) == (0.1, 0.5, "constant")
    # the authors feed raw pixels to every method, the baselines included
    assert {preset.run_config(strategy, "iid", 10)["input-scale"] for strategy in preset.strategies} == {255.0}


def test_fedlap_paper_runs_the_baselines_as_bayesadmm_paper_on_each_split():
    # [C] takes its baseline rows from [P]: the two presets must not drift apart, per-split values included
    bayesadmm, fedlap = get_preset("bayesadmm-paper"), get_preset("fedlap-paper")
    assert set(fedlap.strategies) - set(bayesadmm.strategies) == {"fedlap-func"}  # not in [C]'s tables
    for strategy in bayesadmm.strategies.keys() & fedlap.strategies.keys():
        for split in fedlap.splits:
            expected = bayesadmm.run_config(strategy, split, 10)
            assert fedlap.run_config(strategy, split, 10) == expected, (strategy, split)


def test_fedlap_paper_runs_fedlap_func_as_its_fedlap_with_its_own_delta_and_the_memory_of_app_e5():
    preset = get_preset("fedlap-paper")
    for split in preset.splits:
        func, fedlap = preset.run_config("fedlap-func", split, 10), preset.run_config("fedlap", split, 10)
        assert fedlap["prior-precision"] == 1e-4 and func["prior-precision"] == 1.0
        shared = fedlap.keys() - {"prior-precision"}
        assert {key: func[key] for key in shared} == {key: fedlap[key] for key in shared}
        assert {key: func[key] for key in func.keys() - fedlap.keys()} == {
            "memory-points-per-class": 1,
            "function-weight": 1e-3,
            "server-fit-steps": 5000,
            "server-fit-lr": 1e-3,
        }


def test_dsvgd_paper_schedules_one_fedavg_client_a_round_with_about_200_steps():
    preset = get_preset("dsvgd-paper")
    for clients, epochs in ((20, 7), (2, 1)):
        values = preset.run_config("fedavg", "iid", clients)
        assert values["fraction-train"] * clients == pytest.approx(1.0)
        assert values["local-epochs"] == epochs


@pytest.fixture
def captured(monkeypatch):
    """What `fedbayes local` would run, without starting it."""
    runs: list[launcher.LocalRun] = []
    monkeypatch.setattr(launcher, "run_local", runs.append)
    return runs


def test_local_starts_from_the_preset_and_every_set_wins(tmp_path, captured, capsys):
    argv = ["local", "--strategy", "fedprox", "--split", "dirichlet", "--clients", "3", "--rounds", "2"]
    main([*argv, "--preset", "bayesadmm-paper", "--set", "proximal-mu=0.5", "--workdir", str(tmp_path / "a")])
    main([*argv, "--preset", "bayesadmm-paper", "--fraction", "0.5", "--workdir", str(tmp_path / "b")])
    main([*argv, "--workdir", str(tmp_path / "c")])
    with_set, with_fraction, without = captured
    expected = get_preset("bayesadmm-paper").run_config("fedprox", "dirichlet", 3)
    assert with_set.overrides == {**expected, "proximal-mu": 0.5}
    assert (with_set.fraction, with_set.dataset) == (0.1, "fmnist")  # the paper's data, not given otherwise
    assert with_fraction.fraction == 0.5 and with_fraction.overrides == expected
    assert (without.fraction, without.overrides) == (1.0, {})
    assert "preset bayesadmm-paper: [C] Möllenhoff" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--preset", "table1", "--strategy", "fedavg"], "unknown preset 'table1': one of bayesadmm-paper"),
        (["--preset", "dsvgd-paper", "--strategy", "bayesadmm"], "preset 'dsvgd-paper' has no settings for strategy"),
        (
            ["--preset", "bayesadmm-paper", "--strategy", "fedavg", "--split", "two-class"],
            "preset 'bayesadmm-paper' describes the splits iid, dirichlet, not 'two-class'",
        ),
    ],
)
def test_what_a_preset_does_not_cover_is_refused_before_anything_starts(tmp_path, captured, capsys, args, message):
    code = main(["local", "--clients", "2", "--rounds", "1", "--workdir", str(tmp_path / "run"), *args])
    assert code == 1
    assert message in capsys.readouterr().err
    assert captured == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("name", "strategy", "split"), CASES)
def test_the_printed_run_config_reads_back_under_flowers_parser(name, strategy, split):
    preset = get_preset(name)
    printed = describe(name, strategy, split).splitlines()
    string = next(line for line in printed if line.startswith("as `fedbayes run ... -c`: ")).split(": ", 1)[1]
    parsed = parse_config_args([string])  # `-c` takes the string as one argument
    expected = {"strategy": strategy, "split": split, "dataset": preset.dataset, "fraction": preset.fraction}
    assert parsed == {**expected, **preset.run_config(strategy, split, preset.clients)}
