"""`fedbayes report`: the plots and index of runs whose rows the real round loop wrote (in process, scripted grid),
checked as a person would see them, in a real headless Chromium; and the refusals that name what is wrong."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedbayes.deploy.flower_app import toml_value
from fedbayes.deploy.launcher import RUN_CONFIG_FILE
from fedbayes.tasks.report import PLOTS, load_runs
from tests.support import LABELS, ROOT, fedavg_reply, improving_metrics
from tests.support import run_loop as run
from tests.support.processes import cli_env, fedbayes

CHROMIUM = Path("/usr/bin/chromium")


def results_of_a_run(directory: Path, rogue: bool = False) -> Path:
    """The results file of a 5-round FedAvg run through server/loop.py; with `rogue`, node 1's updates are absurd, so
    it is refused and quarantined."""
    directory.mkdir(parents=True, exist_ok=True)

    def reply(server_round, node):
        return fedavg_reply(f"client-{node}", server_round, value=1e30 if rogue and node == 1 else 1.0)

    run(directory, reply, evaluate=improving_metrics, **{"max-client-rejections": 2, "quarantine-rounds": 2})
    return directory / "r.jsonl"


def local_workdir(directory: Path, config: dict) -> Path:
    """A directory laid out as `fedbayes local` leaves its workdir: the run config it submitted and its results."""
    results = results_of_a_run(directory / "rows")
    directory.joinpath(RUN_CONFIG_FILE).write_text(
        "".join(f"{key} = {toml_value(value)}\n" for key, value in {**config, "results-path": str(results)}.items())
    )
    return directory


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """`fedbayes report` of a workdir (BayesADMM-like: with ensemble metrics) and a bare results file with a rogue."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # as conftest's, for a module fixture
    base = tmp_path_factory.mktemp("report")
    workdir = local_workdir(
        base / "fedavg-run", {"strategy": "fedavg", "num-server-rounds": 5, "fraction": 0.02, "model": "logreg"}
    )
    bare = results_of_a_run(base / "bare", rogue=True)
    out = base / "out"
    finished = fedbayes(["report", str(workdir), str(bare), "--out", str(out)])
    assert finished.returncode == 0, finished.stdout + finished.stderr
    return out, finished


def test_every_plot_and_the_index_are_written(report):
    out, finished = report
    from matplotlib.image import imread

    for plot in PLOTS:
        image = imread(out / plot.file)
        assert image.shape[0] >= 300 and image.shape[1] >= 900, plot.file  # two runs side by side, or three metrics
        assert image[..., :3].std() > 0.05, f"{plot.file} is blank"
    assert f"and {out / 'index.html'}" in finished.stdout
    page = (out / "index.html").read_text()
    assert [f'src="{plot.file}"' in page for plot in PLOTS] == [True] * len(PLOTS)
    assert "<th>fedavg-run</th>" in page and "<th>r</th>" in page  # the workdir's name, the file's stem
    assert "settings unknown" in page  # the bare results file
    assert "<th>model</th><td>&quot;logreg&quot;</td><td>—</td>" in page  # the workdir's run config


def test_rows_carry_what_the_plots_need(report):
    """The round loop's rows hold every key the figures draw, the reliability bins among them."""
    runs = load_runs([report[0].parent / "bare" / "r.jsonl"])
    rows = runs[0].rows
    assert [row["round"] for row in rows] == [1, 2, 3, 4, 5]
    assert sum(rows[-1]["reliability"]["count"]) == len(LABELS)
    assert rows[1]["quarantined"] == ["node 1"] and rows[0]["clients_rejected"] == 1
    assert {"push", "first_reply", "last_reply", "aggregate", "evaluate"} <= set(rows[0]["phase_seconds"])


def image_sizes_in_chromium(page: Path, profile: Path) -> dict[str, str]:
    """Each <img> of `page` as Chromium loaded it, "WxH" (0x0: it did not load): a copy of the page with a script
    that writes the sizes into the DOM once everything loaded, dumped by headless Chromium."""
    probe = page.with_name("probe.html")
    probe.write_text(
        page.read_text().replace(
            "</body>",
            """<script>
window.addEventListener("load", () => {
  const sizes = document.createElement("pre");
  sizes.id = "image-sizes";
  sizes.textContent = [...document.images].map(i => `${i.getAttribute("src")}=${i.naturalWidth}x${i.naturalHeight}`)
    .join(" ");
  document.body.appendChild(sizes);
});
</script></body>""",
        )
    )
    dom = chromium(profile, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()).stdout
    found = re.search(r'<pre id="image-sizes">(.*?)</pre>', dom)
    assert found, f"Chromium's DOM has no image sizes:\n{dom[-2000:]}"
    return dict(entry.split("=") for entry in found.group(1).split())


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="no /usr/bin/chromium: install Debian's chromium (make test does, "
    "as root) to check the report's page in a headless browser",
)
def test_the_index_shows_every_plot_in_a_real_browser(report, tmp_path):
    from PIL import Image

    out = report[0]
    page = tmp_path / "page"
    shutil.copytree(out, page)
    screenshot = tmp_path / "screenshot.png"
    chromium(
        tmp_path / "profile", f"--screenshot={screenshot}", "--window-size=1200,2000", (page / "index.html").as_uri()
    )
    pixels = np.asarray(Image.open(screenshot).convert("L"), dtype=float)
    assert pixels.shape == (2000, 1200)
    assert pixels.std() > 20, "the screenshot is blank"  # text, tables and plots on white
    assert (pixels < 128).mean() > 0.01  # ink: a page of text and plots, not an empty one

    sizes = image_sizes_in_chromium(page / "index.html", tmp_path / "profile")
    assert sorted(sizes) == sorted(plot.file for plot in PLOTS)
    assert all(size != "0x0" for size in sizes.values()), sizes
    (page / "clients.png").unlink()  # the check sees an image that does not load
    assert image_sizes_in_chromium(page / "index.html", tmp_path / "profile")["clients.png"] == "0x0"


def test_a_results_file_holding_two_federations_reports_two_runs(tmp_path):
    """results-exists=append: a second federation's rows follow the first's, from round 1 again."""
    rows = results_of_a_run(tmp_path / "one").read_text()
    appended = tmp_path / "appended.jsonl"
    appended.write_text(rows + rows)
    runs = load_runs([appended, appended])
    assert [run.name for run in runs] == ["appended (1)", "appended (2)", "appended (1) #2", "appended (2) #2"]
    assert all([row["round"] for row in run.rows] == [1, 2, 3, 4, 5] for run in runs)


def test_what_is_no_run_is_refused_by_name(tmp_path):
    (tmp_path / "not-a-workdir").mkdir()
    finished = fedbayes(["report", str(tmp_path / "not-a-workdir"), "--out", str(tmp_path / "out")])
    assert finished.returncode == 1
    assert (
        f"{tmp_path / 'not-a-workdir'} is no `fedbayes local` workdir: it has no {RUN_CONFIG_FILE}"
        in finished.last_error_line
    )
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n" + json.dumps({"round": 1, "accuracy": 0.5}) + "\n")
    finished = fedbayes(["report", str(broken), "--out", str(tmp_path / "out")])
    assert finished.returncode == 1
    assert f"{broken}: none of its 2 lines is a usable results row" in finished.last_error_line
    assert f"warning: {broken}:1: not a JSON row" in finished.stderr
    assert f"warning: {broken}:2: not a results row (no nll, ece)" in finished.stderr
    assert not (tmp_path / "out").exists()


def test_without_matplotlib_the_error_names_the_extra(tmp_path):
    results = results_of_a_run(tmp_path / "run")
    blocked = (  # an interpreter on which matplotlib is not installed: importing it fails as it would there
        "import sys\n"
        "class NoMatplotlib:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] == 'matplotlib':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name='matplotlib')\n"
        "sys.meta_path.insert(0, NoMatplotlib())\n"
        "from fedbayes.deploy.cli import main\n"
        f"sys.exit(main(['report', {str(results)!r}, '--out', {str(tmp_path / 'out')!r}]))\n"
    )
    finished = subprocess.run(
        [sys.executable, "-c", blocked], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300
    )
    assert finished.returncode == 1
    assert finished.stderr.strip().splitlines()[-1] == (
        "fedbayes: error: fedbayes report needs matplotlib, which is not installed: pip install 'fedbayes[report]'"
    )
