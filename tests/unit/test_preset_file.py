"""The presets file's reader (deploy/presets.py, the format in deploy/presets.toml's header): a small file reads back
as the settings it spells, named sets first and their own keys winning in place; a malformed one is refused with the
file and the key named."""

from __future__ import annotations

import pytest

from fedbayes.deploy.presets import PRESET_FILE, load_presets
from fedbayes.tasks.config import ConfigError

VALID = """
[references]
"[X]" = "A paper"

[settings.base]
lr = { value = 1e-3, source = "[X] Sec. 1" }
local-epochs = { value = 10, source = "[X] Sec. 2" }

[notes]
shared = ["what no key says"]

[presets.tiny]
paper = "[X] A paper"
results = "Table 1"
section = "Sec. 3"
splits = ["iid", "dirichlet"]
dataset = "fmnist"
fraction = 1
clients = 4
rounds = 2
common.batch-size = { value = 32, source = "[X] Sec. 3" }
strategies.fedavg.with = ["base"]
strategies.fedavg.local-epochs = { value = 5, source = "ours" }
strategies.fedavg.fraction-train = { divided-by-clients = 1.0, source = "one client a round" }
strategies.fedprox.with = ["base"]
strategies.fedprox.local-epochs = { epochs-for-steps = { steps = 300, batch = 100, examples = 60000 }, source = "L" }
by-split.fedavg.dirichlet.lr = { value = 0.1, source = "[X] Sec. 4" }
unmatched = ["its own"]
unmatched-with = ["shared"]
"""


def written(tmp_path, text: str):
    path = tmp_path / "presets.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_file_reads_back_as_the_settings_it_spells(tmp_path):
    read = load_presets(written(tmp_path, VALID))
    preset = read.presets["tiny"]
    assert read.references == {"[X]": "A paper"}
    assert preset.source == "[X] A paper, Table 1, Sec. 3" and preset.fraction == 1.0
    assert preset.unmatched == ("its own", "what no key says")
    fedavg = preset.settings("fedavg", "iid")
    assert list(fedavg) == ["batch-size", "lr", "local-epochs", "fraction-train"]  # a key set again keeps its place
    assert preset.run_config("fedavg", "iid", 4) == {
        "batch-size": 32,
        "lr": 1e-3,
        "local-epochs": 5,
        "fraction-train": 0.25,
    }
    assert preset.run_config("fedavg", "dirichlet", 4)["lr"] == 0.1
    # 300 steps of 100 of 60,000 examples shared by K clients: 2 epochs for 4 clients, 0.2 for 0.4 -> at least 1
    assert [preset.run_config("fedprox", "iid", k)["local-epochs"] for k in (4, 2, 1)] == [2, 1, 1]


def test_the_shipped_file_holds_the_papers_presets():
    assert list(PRESET_FILE.presets) == ["bayesadmm-paper", "fedlap-paper", "dsvgd-paper"]
    assert {label for label in PRESET_FILE.references} == {"[C]", "REF", "[P]", "[K]"}


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("[notes]", "[note]", r"presets\.toml: note: unknown key \(known: references, settings, notes, presets\)"),
        ("rounds = 2", "round = 2", r"presets\.toml: presets\.tiny\.round: unknown key"),
        ("rounds = 2", "", r"presets\.toml: presets\.tiny\.rounds: missing"),
        ("clients = 4", 'clients = "4"', r"presets\.toml: presets\.tiny\.clients: must be int, not '4'"),
        ("common.batch-size", "common.batch-sise", r"presets\.tiny\.common\.batch-sise: not a run-config key"),
        ('source = "[X] Sec. 3" }', 'sources = "[X] Sec. 3" }', r"presets\.tiny\.common\.batch-size\.sources: unknown"),
        (
            "{ value = 32,",
            "{ value = 32, divided-by-clients = 1.0,",
            r"batch-size: needs exactly one of value, divided",
        ),
        ('with = ["base"]\nstrategies.fedavg.local', 'with = ["bass"]\nstrategies.fedavg.local', r"no settings\.bass"),
        ("examples = 60000", "examples = 60000, epochs = 1", r"local-epochs\.epochs-for-steps\.epochs: unknown key"),
        ("by-split.fedavg.dirichlet", "by-split.fedavg.two-class", r"by-split\.fedavg\.two-class: unknown key"),
        ('unmatched-with = ["shared"]', 'unmatched-with = ["sharred"]', r"unmatched-with: no notes\.sharred"),
        ("[settings.base]", '[settings.base]\nwith = ["base"]', r"settings\.base: takes itself: base -> base"),
        ("fraction = 1", "fraction = ", r"presets\.toml: not TOML"),
    ],
)
def test_a_malformed_file_is_refused_naming_the_file_and_the_key(tmp_path, old, new, message):
    assert old in VALID
    with pytest.raises(ConfigError, match=message):
        load_presets(written(tmp_path, VALID.replace(old, new, 1)))
