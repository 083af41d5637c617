"""docs/running/server.md by its own commands: from empty machines to a trained federation with `fedbayes server`.

Three network namespaces stand for the page's machines (tests/support/netns.py): the server `fl.example.org` and the
client machines `hospital-a` and `hospital-b`, each with its own address, its own /etc/hosts naming the three, and its
own home directory, where its commands run. Every shell block of the page that says which machine it is for (`# on the
server`, `# on hospital-a`) runs there as written; `hospital-b` runs `hospital-a`'s blocks with its own name and data
file, as the page says. Only the install (the machines share this checkout's virtual environment) is not run, and
`scp` copies between the home directories (no SSH server here). For a test of minutes, not of an hour, the demo data
and the rounds are smaller than the page's (`FASTER`). The commands that stay in the foreground (`fedbayes server`,
`fedbayes client`) run in the background until they say they are up; at the end they are stopped as an operator
stops them (Ctrl-C, systemd's SIGTERM) and must leave nothing running.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedbayes.client.state import ClientStateStore
from tests.support import ROOT
from tests.support.netns import NetnsLab
from tests.support.processes import cli_env, processes_with_env

pytestmark = pytest.mark.integration

PAGE = ROOT / "docs" / "running" / "server.md"
MACHINE_MARKER = re.compile(r"# on (the server|hospital-a)\n")
MACHINES = {"the server": "server", "hospital-a": "hospital-a"}
HOST_NAMES = {"server": ["fl.example.org"], "hospital-a": ["hospital-a"], "hospital-b": ["hospital-b"]}
SECOND_CLIENT = {"hospital-a": "hospital-b", "client-0.npz": "client-1.npz"}  # the page: "the same with ..."
FASTER = {"--fraction 0.1": "--fraction 0.02", "num-server-rounds=5": "num-server-rounds=2"}
ROUNDS = 2
FEDERATION = "first"
UP = {"server": "fedbayes server: ready", "client": "SuperNode ID"}  # Flower's line once the node is active
STARTUP_TIMEOUT = 600.0
COMMAND_TIMEOUT = 1200.0
STEPS = {  # what the page must take a stranger through, as `fedbayes` subcommands
    "pki init",
    "export-partitions",
    "pki supernode-key",
    "server --check",
    "server",
    "pki register",
    "pki connection",
    "app",
    "client --check",
    "client",
    "run",
    "export",
    "predict",
}
# `scp` between the machines' homes: HOST:PATH is PATH in that machine's home (FEDBAYES_TEST_HOMES).
SCP = f"""#!{sys.executable}
import json, os, shutil, sys
from pathlib import Path

homes = json.loads(os.environ["FEDBAYES_TEST_HOMES"])


def place(argument):
    host, colon, path = argument.partition(":")
    return Path(homes[host]) / path if colon and "/" not in host else Path(argument)


*sources, target = [place(argument) for argument in sys.argv[1:] if not argument.startswith("-")]
for source in sources:
    shutil.copyfile(source, target / source.name if target.is_dir() else target)
"""


@dataclass(frozen=True)
class Step:
    machine: str
    script: str

    @property
    def commands(self) -> list[list[str]]:
        return [shlex.split(line) for line in self.script.replace("\\\n", " ").splitlines() if line.strip()]

    @property
    def foreground(self) -> str | None:
        """`server` or `client` for a block that is one `fedbayes server` or `fedbayes client` that keeps running."""
        (command, *others) = self.commands
        kind = command[1] if command[:1] == ["fedbayes"] and len(command) > 1 else ""
        return kind if not others and kind in UP and "--check" not in command else None


def page_steps() -> list[Step]:
    """The page's shell blocks for a machine, in order, made faster (FASTER); each of hospital-a's also for
    hospital-b."""
    text = PAGE.read_text()
    for slow, fast in FASTER.items():
        assert text.count(slow) == 1, f"{PAGE} no longer has {slow!r} once: update FASTER"
        text = text.replace(slow, fast)
    steps = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S):
        if marker := MACHINE_MARKER.match(block):
            step = Step(MACHINES[marker[1]], block[marker.end() :])
            steps.append(step)
            if step.machine == "hospital-a":
                steps.append(Step("hospital-b", _replace_all(step.script, SECOND_CLIENT)))
    return steps


def _replace_all(text: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        text = text.replace(old, new)
    return text


def subcommand(command: list[str]) -> str:
    """`pki init`, `server --check`, `run`, ... of a `fedbayes` command ("" for another program)."""
    if command[:1] != ["fedbayes"]:
        return ""
    name = " ".join(command[1:3]) if command[1] == "pki" else command[1]
    return f"{name} --check" if "--check" in command else name


class Machines:
    """The lab's machines, each with its home directory and environment; the processes started in the background."""

    def __init__(self, lab: NetnsLab, root: Path) -> None:
        self.lab = lab
        self.homes = {name: root / name for name in HOST_NAMES}
        for home in self.homes.values():
            home.mkdir(parents=True)
        shims = root / "bin"
        shims.mkdir()
        (shims / "scp").write_text(SCP)
        (shims / "scp").chmod(0o755)
        dialled = {host_name: str(self.homes[name]) for name, names in HOST_NAMES.items() for host_name in names}
        base = {key: value for key, value in cli_env().items() if key != "FLWR_HOME"}
        self.env = {
            name: {
                **base,
                "HOME": str(home),
                "PATH": os.pathsep.join([str(shims), base["PATH"]]),
                "FEDBAYES_TEST_HOMES": json.dumps(dialled),
            }
            for name, home in self.homes.items()
        }
        self.background: dict[str, tuple[subprocess.Popen, Path]] = {}

    def run(self, step: Step) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.lab[step.machine].command(["bash", "-e", "-c", step.script]),
            cwd=self.homes[step.machine],
            env=self.env[step.machine],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )

    def start(self, step: Step, kind: str) -> None:
        """Start the step's one command (exec'd: a signal reaches it, as a Ctrl-C would) and wait until it is up."""
        output = self.homes[step.machine] / f"{kind}.out"
        with output.open("w") as sink:
            process = subprocess.Popen(
                self.lab[step.machine].command(["bash", "-c", f"exec {step.script}"]),
                cwd=self.homes[step.machine],
                env=self.env[step.machine],
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.background[step.machine] = (process, output)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while UP[kind] not in output.read_text(errors="replace"):
            exited = process.poll()
            assert exited is None, f"{step.machine}: {kind} exited ({exited}):\n{output.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{step.machine}: {kind} not up:\n{output.read_text()[-3000:]}"
            time.sleep(0.5)

    def stop(self, machine: str, sig: signal.Signals) -> tuple[int, str]:
        process, output = self.background.pop(machine)
        process.send_signal(sig)
        process.wait(timeout=120)
        return process.returncode, output.read_text(errors="replace")

    def left_running(self) -> dict[str, list[int]]:
        """Live processes started on each machine (they carry its home in their environment)."""
        return {name: found for name, home in self.homes.items() if (found := processes_with_env("HOME", str(home)))}

    def kill_everything(self) -> None:
        for process, _ in self.background.values():
            if process.poll() is None:
                process.kill()
        for pids in self.left_running().values():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.mark.timeout(3600)
def test_the_server_page_takes_empty_machines_to_a_trained_federation(tmp_path):
    steps = page_steps()
    done = {subcommand(command) for step in steps for command in step.commands} - {""}
    assert done >= STEPS, f"the page no longer has {sorted(STEPS - done)}"
    with NetnsLab(list(HOST_NAMES), HOST_NAMES) as lab:
        machines = Machines(lab, tmp_path)
        try:
            outputs = {}
            for step in steps:
                if kind := step.foreground:
                    machines.start(step, kind)
                    continue
                result = machines.run(step)
                assert result.returncode == 0, f"{step.machine}: {step.script}\n{result.stdout}\n{result.stderr}"
                for command in step.commands:
                    outputs[subcommand(command)] = result.stdout + result.stderr
            client_codes = {client: machines.stop(client, signal.SIGINT) for client in ("hospital-a", "hospital-b")}
            server_code, server_output = machines.stop("server", signal.SIGTERM)
            left = machines.left_running()
        finally:
            machines.kill_everything()
    server_home = machines.homes["server"]
    rows = [json.loads(line) for line in (server_home / "state" / f"{FEDERATION}.jsonl").read_text().splitlines()]
    assert [row["round"] for row in rows] == list(range(1, ROUNDS + 1)), outputs["run"][-3000:]
    # Each client's reply was accepted and committed in every round; each client kept its state of every round.
    assert all((row["clients"], row["clients_sent"], row["rejected"]) == (2, 2, {}) for row in rows), rows
    for client in ("hospital-a", "hospital-b"):
        store = ClientStateStore(machines.homes[client] / "fedbayes-state", FEDERATION, client)
        assert store.saved_rounds() == list(range(1, ROUNDS + 1)), client
    assert f"round   {ROUNDS}/{ROUNDS}" in outputs["run"], outputs["run"][-3000:]
    assert (server_home / f"{FEDERATION}.safetensors").is_file() and "accuracy" in outputs["predict"]
    assert "ok: run the same command without --check" in outputs["server --check"], outputs["server --check"]
    assert "fedbayes run " in server_output and "fedbayes pki register " in server_output  # what to run next
    # Stopped as an operator stops them: Ctrl-C (130) for the clients, systemd's SIGTERM (0) for the server.
    assert {client: code for client, (code, _) in client_codes.items()} == {"hospital-a": 130, "hospital-b": 130}
    assert server_code == 0 and "fedbayes server: stopped (SIGTERM)" in server_output, server_output[-3000:]
    assert not left, left
