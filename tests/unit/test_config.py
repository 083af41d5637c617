"""Run-config parsing: pyproject's defaults are valid, bad values name their key."""

import tomllib

import pytest

from fedbayes.client.runtime import NodeSettings
from fedbayes.deploy.flower_app import app_pyproject
from fedbayes.deploy.launcher import LocalRun, run_local
from fedbayes.strategies import default_run_config, run_settings
from fedbayes.tasks.config import ConfigError, EvaluationSettings, TrackingSettings, TrainingSettings, TrustSettings
from tests.support import DEFAULTS, pyproject_run_config


def test_pyproject_defaults_parse():
    settings = run_settings(DEFAULTS)
    assert settings.strategy == "fedavg" and settings.model == "mlp" and settings.lr == 0.001


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("split", "random", "'split' must be one of iid, dirichlet, two-class"),
        ("fraction", 0.0, "'fraction' must be in (0, 1]"),
        ("batch-size", 0, "'batch-size' must be >= 1"),
        ("lr", "fast", "'lr' must be float"),
        ("num-server-rounds", 2.5, "'num-server-rounds' must be int"),
        ("federation", "../etc", "'federation' must be \"\" (a new federation) or match"),
        ("optimizer", "lbfgs", "'optimizer' must be one of adam, sgd"),
        ("feddyn-alpha", 0.0, "'feddyn-alpha' must be > 0"),
        ("max-grad-norm", -1.0, "'max-grad-norm' must be >= 0"),
        ("kde-bandwidth", -0.5, "'kde-bandwidth' must be >= 0"),
        ("site-damping", 1.5, "'site-damping' must be in [0, 1]"),
        ("particles", 0, "'particles' must be >= 1"),
        ("dsvgd-scheduler", "fifo", "'dsvgd-scheduler' must be one of round-robin, random"),
        ("seed", -1, "'seed' must be in [0, 2^32)"),  # numpy refuses negative seeds
        ("seed", 2**32, "'seed' must be in [0, 2^32)"),
        ("wait-for-clients-timeout", -1.0, "'wait-for-clients-timeout' must be >= 0"),
        ("wait-for-clients-timeout", float("inf"), "'wait-for-clients-timeout' must be finite"),
        ("max-payload-mb", float("nan"), "'max-payload-mb' must be finite"),
        ("results-exists", "overwrite", "'results-exists' must be one of refuse, append, replace"),
    ],
)
def test_bad_values_name_the_key(key, value, message):
    with pytest.raises(ConfigError) as error:
        run_settings({**DEFAULTS, key: value})
    assert message in str(error.value)


def test_missing_key_is_reported():
    config = dict(DEFAULTS)
    del config["seed"]
    with pytest.raises(ConfigError, match="missing 'seed'"):
        run_settings(config)


def test_integer_accepted_for_float_keys():
    assert run_settings({**DEFAULTS, "lr": 1}).lr == 1.0


def test_node_settings():
    node = NodeSettings.from_node_config({"partition-id": 2, "num-partitions": 3}, default_device="cpu")
    assert node.client_id == "client-2" and node.device == "cpu"
    with pytest.raises(ConfigError, match="partition-id"):
        NodeSettings.from_node_config({"partition-id": 3, "num-partitions": 3}, default_device="cpu")
    with pytest.raises(ConfigError, match="client-id"):
        NodeSettings.from_node_config({"client-id": "a b", "data-path": "/x.npz"}, default_device="cpu")


def test_set_overrides_are_typed_and_accept_underscores():
    from fedbayes.deploy.launcher import parse_override

    assert parse_override("proximal_mu=0.1") == ("proximal-mu", 0.1)
    assert parse_override("local-epochs=5") == ("local-epochs", 5)
    assert parse_override("rescale-lr=true") == ("rescale-lr", True)
    assert parse_override("hidden=200,100") == ("hidden", "200,100")
    assert parse_override("hidden=100") == ("hidden", "100")  # one layer: a string key stays a string
    assert parse_override("federation=2026") == ("federation", "2026")
    with pytest.raises(ValueError, match="key=value"):
        parse_override("lr")


@pytest.mark.parametrize(
    ("strategy", "overrides", "message"),
    [
        ("nope", {}, "'strategy' must be one of"),
        ("fedavg", {"lr": -1.0}, "'lr' must be > 0"),
        ("fedavg", {"lrr": 1.0}, r"unknown run-config key 'lrr' \(did you mean 'lr'\?\)"),
    ],
)
def test_fedbayes_local_refuses_a_bad_run_config_before_starting_anything(tmp_path, strategy, overrides, message):
    spec = LocalRun(strategy=strategy, clients=1, rounds=1, workdir=tmp_path / "run", overrides=overrides, quiet=True)
    with pytest.raises(ConfigError, match=message):
        run_local(spec)
    assert not (tmp_path / "run").exists()  # no SuperLink, no SuperNode, no workdir


def test_fedbayes_local_refuses_a_results_file_it_would_overwrite_before_starting_anything(tmp_path):
    results = tmp_path / "mine.jsonl"
    results.write_text('{"round": 1, "mine": true}\n')
    spec = LocalRun(strategy="fedavg", clients=1, rounds=1, workdir=tmp_path / "run", results=results, quiet=True)
    with pytest.raises(ConfigError, match="^run config 'results-path': .*mine.jsonl is not empty and results-exists"):
        run_local(spec)
    for told in ("append", "replace"):  # told: the refusal that stops the run is a later check's
        spec.overrides = {"results-exists": told, "hidden": "abc"}
        with pytest.raises(ConfigError, match="^run config 'hidden'"):
            run_local(spec)
    assert results.read_text() == '{"round": 1, "mine": true}\n'
    assert not (tmp_path / "run").exists()  # no SuperLink, no SuperNode, no workdir


def test_the_checkout_pyproject_lists_exactly_the_declared_keys_and_defaults():
    """`flwr run .` in a checkout and `fedbayes app` (the installed package) accept the same keys and defaults."""
    declared = default_run_config()
    listed = pyproject_run_config()
    assert sorted(listed) == sorted(declared)
    assert {key: (value, type(value)) for key, value in listed.items()} == {
        key: (value, type(value)) for key, value in declared.items()
    }


def test_a_written_app_lists_every_key_and_an_out_of_tree_strategys_own(tmp_path, monkeypatch):
    plugin = tmp_path / "keyed_plugin.py"
    plugin.write_text(
        "from dataclasses import dataclass\n"
        "from fedbayes.strategies import Algorithm\n"
        "from fedbayes.strategies.fedavg.client import client_update\n"
        "from fedbayes.strategies.fedavg.server import FedAvg\n"
        "from fedbayes.tasks.config import key\n"
        "@dataclass(frozen=True)\n"
        "class TrimSettings:\n"
        "    trim_share: float = key(0.1, 'the share trimmed')\n"
        "KEYED = Algorithm(FedAvg, client_update, TrimSettings)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    app = tomllib.loads(app_pyproject("keyed_plugin:KEYED"))["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "fedbayes.server.app:app", "clientapp": "fedbayes.client.app:app"}
    assert app["config"] == {**default_run_config(), "trim-share": 0.1}
    settings = run_settings({**app["config"], "strategy": "keyed_plugin:KEYED", "trim-share": 0.25})
    assert settings.value("trim-share") == 0.25
    with pytest.raises(ConfigError, match="unknown run-config key"):
        run_settings({**default_run_config(), "trim-share": 0.25})  # fedavg has no such key


def test_a_settings_field_whose_default_is_not_its_type_is_refused_where_it_is_declared():
    from dataclasses import dataclass

    from fedbayes.tasks.config import key, keys_of

    @dataclass(frozen=True)
    class Wrong:
        rounds: int = key(2.5, "a float default for an int key")

    with pytest.raises(TypeError, match="Wrong.rounds is declared int, but its default 2.5 is a float"):
        keys_of(Wrong)


def test_the_training_group_holds_the_local_training_keys_and_the_rounds():
    settings = run_settings(
        {**DEFAULTS, "local-epochs": 3, "batch-size": 16, "lr": 0.01, "optimizer": "sgd", "num-server-rounds": 4}
    )
    assert settings.training == TrainingSettings(
        local_epochs=3,
        batch_size=16,
        lr=0.01,
        lr_schedule="constant",
        optimizer="sgd",
        seed=settings.seed,
        num_rounds=4,
    )


def test_local_training_sends_the_training_groups_keys_and_the_rounds_learning_rate():
    from fedbayes.protos import payloads_pb2 as pb
    from fedbayes.strategies.base import local_training

    training = run_settings(
        {**DEFAULTS, "local-epochs": 3, "batch-size": 16, "lr": 0.01, "lr-schedule": "cosine", "num-server-rounds": 4}
    ).training
    assert local_training(training, 3, weight_decay=0.5) == pb.LocalTraining(
        epochs=3, batch_size=16, learning_rate=0.005, optimizer="adam", weight_decay=0.5, seed=training.seed
    )
    assert local_training(training, 1, epochs=7).epochs == 7


def test_the_evaluation_group_holds_the_server_evaluations_keys_and_the_rounds():
    settings = run_settings(
        {
            **DEFAULTS,
            "eval-every": 2,
            "eval-fraction": 0.5,
            "eval-threads": 3,
            "eval-batched": True,
            "eval-batch-size": 64,
            "ensemble-samples": 5,
            "ood-inputs": "inverted",
            "seed": 7,
            "num-server-rounds": 4,
        }
    )
    assert settings.evaluation == EvaluationSettings(
        eval_every=2,
        eval_fraction=0.5,
        eval_threads=3,
        eval_batched=True,
        eval_batch_size=64,
        ensemble_samples=5,
        ood_inputs="inverted",
        seed=7,
        num_rounds=4,
    )


def test_the_tracking_group_holds_the_tracking_target_and_the_federation():
    settings = run_settings({**DEFAULTS, "tracking": "tensorboard:/tmp/tb", "federation": "fed-1"})
    assert settings.tracker == TrackingSettings(tracking="tensorboard:/tmp/tb", federation="fed-1")
    assert settings.tracking == "tensorboard:/tmp/tb"  # the key keeps its own attribute


def test_the_trust_group_holds_the_keys_the_trust_boundary_checks_replies_against():
    settings = run_settings(
        {
            **DEFAULTS,
            "max-payload-mb": 8.0,
            "max-client-examples": 500,
            "max-clients": 7,
            "client-identity": "reconnect",
            "client-registry": "/etc/registry.json",
            "screen-ratio": 5.0,
            "max-client-rejections": 2,
            "quarantine-rounds": 4,
        }
    )
    assert settings.trust == TrustSettings(
        max_payload_mb=8.0,
        max_client_examples=500,
        max_clients=7,
        client_identity="reconnect",
        client_registry="/etc/registry.json",
        screen_ratio=5.0,
        max_client_rejections=2,
        quarantine_rounds=4,
    )


def test_the_local_learning_rate_is_constant_or_cosine_annealed_over_the_rounds():
    constant = run_settings({**DEFAULTS, "lr": 0.01, "num-server-rounds": 4}).training
    assert [constant.round_lr(r) for r in (1, 3, 4)] == [0.01, 0.01, 0.01]
    cosine = run_settings({**DEFAULTS, "lr": 0.01, "lr-schedule": "cosine", "num-server-rounds": 4}).training
    # progress (round - 1) / 4: 0, 1/2, 3/4 of the half cosine from lr down to 0
    assert [cosine.round_lr(r) for r in (1, 3, 4)] == pytest.approx([0.01, 0.005, 0.01 * (1 - 2**-0.5) / 2])


@pytest.mark.parametrize(
    ("strategy", "given", "parsed"),
    [
        ("bayesadmm", "auto", "cosine"),  # BayesADMM's own: its paper's
        ("fedavg", "auto", "constant"),
        ("fedlap-cov", "auto", "constant"),
        ("p-dsvgd", "auto", "constant"),
        ("bayesadmm", "constant", "constant"),  # a schedule the user names is kept
        ("fedavg", "cosine", "cosine"),
    ],
)
def test_lr_schedule_auto_is_the_strategys_own_and_a_named_schedule_is_kept(strategy, given, parsed):
    settings = run_settings({**DEFAULTS, "strategy": strategy, "lr-schedule": given, "num-server-rounds": 4})
    assert settings.lr_schedule == parsed and settings.training.lr_schedule == parsed
    assert settings.training.round_lr(3) == pytest.approx(0.0005 if parsed == "cosine" else 0.001)


def test_lr_schedule_auto_takes_a_plugged_in_strategys_own_schedule(tmp_path, monkeypatch):
    (tmp_path / "annealed_plugin.py").write_text(
        "from fedbayes.strategies import Algorithm\n"
        "ALGORITHM = Algorithm('fedbayes.strategies.fedavg.server:FedAvg', "
        "'fedbayes.strategies.fedavg.client:client_update', lr_schedule='cosine')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert run_settings({**DEFAULTS, "strategy": "annealed_plugin:ALGORITHM"}).lr_schedule == "cosine"


def test_a_strategy_must_declare_a_schedule_auto_can_become():
    from fedbayes.strategies import Algorithm

    with pytest.raises(ValueError, match="lr_schedule must be 'constant' or 'cosine', got 'auto'"):
        Algorithm("m:server", "m:client", lr_schedule="auto")


def test_a_training_group_left_at_auto_refuses_to_give_a_rate():
    training = TrainingSettings(
        local_epochs=1, batch_size=32, lr=0.01, lr_schedule="auto", optimizer="adam", seed=0, num_rounds=4
    )
    with pytest.raises(ValueError, match="lr-schedule 'auto' has no rate"):
        training.round_lr(1)
