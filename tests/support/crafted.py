"""Files as an attacker writes them, and readers run in a child process whose peak memory is measured.

`rewrite_safetensors` edits a safetensors file (a posterior, a checkpoint) and recomputes its checksum, as anyone who
edits a file can: only what the reader checks beyond the checksum stands between it and the file's claims.
`in_child` runs a reader in a fresh interpreter that has imported torch and fedbayes, and reports the peak resident
memory it reached over that (VmHWM), what it raised, and what it printed. `key_pair` writes Ed25519 key files as
`openssl` or `ssh-keygen` write them; `write_user_models` a user's own models, as a module that marks its import."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from fedbayes.tasks.storage import checksum
from tests.support.processes import cli_env

# The child: the bare interpreter with torch and the readers imported is what its peak is measured over; then `code`
# runs (it may set `rc`), and one RESULT line says what happened.
_CHILD = """
import json, re, sys
import torch
import fedbayes.deploy.cli, fedbayes.deploy.launcher, fedbayes.posterior.predictive, fedbayes.posterior.export
def peak_kib():  # VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's peak, hiding what is below it
    with open("/proc/self/status") as status:
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1))
baseline = peak_kib()
scope, error = {}, None
try:
    exec(sys.argv[1], scope)
except Exception as raised:
    error = f"{type(raised).__name__}: {raised}"
extra = (peak_kib() - baseline) / 1024
print("RESULT " + json.dumps({"extra_mib": extra, "error": error, "rc": scope.get("rc")}), flush=True)
"""


@dataclass(frozen=True)
class ChildOutcome:
    extra_mib: float  # peak RSS over the interpreter with torch and fedbayes imported
    error: str | None  # what `code` raised, as "Type: message"
    rc: int | None  # `code`'s `rc`, if it set one (a command's exit status)
    stdout: str  # what it printed, the RESULT line left out
    stderr: str


def in_child(code: str, cwd: Path, timeout: float = 300) -> ChildOutcome:
    """Run `code` in a fresh `python -c` child whose working directory is `cwd` (so, as for any `python -c`, a module
    there is importable by its name)."""
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, code], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout
    )
    lines = result.stdout.splitlines()
    reports = [line for line in lines if line.startswith("RESULT ")]
    assert result.returncode == 0 and reports, result.stderr[-3000:]
    report = json.loads(reports[-1].removeprefix("RESULT "))
    printed = "\n".join(line for line in lines if not line.startswith("RESULT "))
    return ChildOutcome(report["extra_mib"], report["error"], report["rc"], printed, result.stderr)


def rewrite_safetensors(path: Path, change_metadata=None, change_tensors=None, keep_checksum: bool = False) -> None:
    """Write `path` again with its metadata or tensors changed (in place, by the callables), its checksum
    recomputed unless `keep_checksum`."""
    with safe_open(path, framework="np") as opened:
        metadata = opened.metadata()
    tensors = load_file(path)
    (change_metadata or (lambda m: None))(metadata)
    (change_tensors or (lambda t: None))(tensors)
    if not keep_checksum:
        metadata["checksum"] = checksum(tensors, {key: value for key, value in metadata.items() if key != "signature"})
    save_file(tensors, path, metadata=metadata)


def edit_json_metadata(key: str, **fields):
    """A `change_metadata` that updates the JSON object in metadata entry `key` with `fields`."""

    def change(metadata):
        metadata[key] = json.dumps(json.loads(metadata[key]) | fields)

    return change


def key_pair(folder, name: str, encoding: str = "pem"):
    """An Ed25519 private key file and its public key file, PEM (PKCS #8 / SubjectPublicKeyInfo) or OpenSSH."""
    key = Ed25519PrivateKey.generate()
    if encoding == "pem":
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    else:
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (folder / name).write_bytes(private)
    (folder / f"{name}.pub").write_bytes(public)
    return folder / name, folder / f"{name}.pub"


USER_MODELS = '''"""A user's own models; importing this module leaves a file `imported` next to it."""
import math
import pathlib

from torch import nn

pathlib.Path(__file__).with_name("imported").touch()


def linear(input_shape, num_classes):
    """logreg's layout ("1.weight", "1.bias"): Flatten, then Linear."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


def wider(input_shape, num_classes):
    """One input too many for logreg's layout."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape) + 1, num_classes))
'''


def write_user_models(folder: Path) -> Path:
    """`folder`/user_models.py (USER_MODELS): importable as `user_models` with `folder` on sys.path. A module of that
    name another test imported is forgotten, so that the next import is this one's (and marks it)."""
    (folder / "user_models.py").write_text(USER_MODELS)
    sys.modules.pop("user_models", None)
    importlib.invalidate_caches()
    return folder / "user_models.py"
