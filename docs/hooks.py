"""MkDocs hooks of the fedbayes site (mkdocs.yml `hooks`). Docs tooling only: nothing here is imported by fedbayes.

The plots under benchmarks/results are published at assets/benchmarks/<path> (`on_files`), so the results pages
show the files the benchmarks write instead of copies that could go stale, and a plot that is gone breaks the strict
build.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
PLOTS_URI = "assets/benchmarks"


def on_files(files: Files, config) -> Files:
    for plot in sorted(RESULTS.rglob("*.png")):
        files.append(
            File.generated(config, f"{PLOTS_URI}/{plot.relative_to(RESULTS).as_posix()}", abs_src_path=str(plot))
        )
    return files
