"""Published splits: run config `split-file` (JSON, per client its row indices into the training file) and
`fedbayes partitions --write F`, which writes ours in that format."""

import json

from fedbayes.deploy.cli import main as fedbayes
from fedbayes.tasks.datasets import load_dataset
from fedbayes.tasks.partitions import partition_dataset


def write(tmp_path, clients):
    path = tmp_path / "split.json"
    path.write_text(json.dumps(clients))
    return path


def test_partitions_write_then_replay(tmp_path, capsys):
    out = tmp_path / "ours.json"
    args = ["partitions", "--clients", "3", "--fraction", "0.01", "--split", "dirichlet", "--seed", "4"]
    assert fedbayes([*args, "--write", str(out)]) == 0
    written = capsys.readouterr().out
    labels = load_dataset("fmnist", train=True).labels.numpy()
    expected = partition_dataset(labels, 3, "dirichlet", 4, fraction=0.01)
    assert json.loads(out.read_text()) == [part.tolist() for part in expected]
    assert fedbayes(["partitions", "--clients", "3", "--split-file", str(out)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == written.splitlines()[0]
    assert fedbayes(["partitions", "--clients", "4", "--split-file", str(out)]) == 1
