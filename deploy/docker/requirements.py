"""Print the image's pip requirements: pyproject's dependencies, with the torch pin replaceable.

    python3 deploy/docker/requirements.py [--torch 'torch==2.13.0'] > requirements.txt

Containers run deployment processes only: Flower without its Ray simulation extra, and no torchvision
(the compose path reads Fashion-MNIST from Debian's files and clients' data from .npz files). `--torch`
picks the build: pyproject's pin is PyPI's CUDA build, `torch==2.13.0` a CPU-only build where one is
on the package index. Reads pyproject.toml from the working directory (the build context's root).
"""

import argparse
import re
import tomllib

parser = argparse.ArgumentParser()
parser.add_argument("--torch", default="", help="requirement replacing pyproject's torch pin")
args = parser.parse_args()
with open("pyproject.toml", "rb") as pyproject:
    dependencies = tomllib.load(pyproject)["project"]["dependencies"]
for requirement in dependencies:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    if match is None:
        raise SystemExit(f"pyproject.toml: a dependency without a name: {requirement!r}")
    name = match.group(0).lower()
    if name == "torchvision":
        continue
    if name == "torch" and args.torch:
        requirement = args.torch
    print(requirement.replace("flwr[simulation]", "flwr"))
