"""The SuperLink load harness: a real `fedbayes superlink` and ServerApp against N nodes speaking the Fleet API
(tests/support/fleet_nodes.py), m sampled a round, measured from /proc, the nodes' counters and, optionally, py-spy.
benchmarks/superlink_load.py sweeps it and tabulates; tests/integration/test_superlink_load.py runs it small."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedbayes.deploy.launcher import LocalFederation
from fedbayes.deploy.processes import ManagedProcess, is_serverapp
from fedbayes.deploy.supernode import DEFAULT_POLL
from fedbayes.strategies import default_run_config, run_settings
from fedbayes.tasks.runlog import RunFailed

REPO = Path(__file__).resolve().parents[2]
FLEET_NODES = Path(__file__).resolve().with_name("fleet_nodes.py")  # run as a script: no tests.support imports
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
SAMPLE_INTERVAL = 0.5  # seconds between /proc samples
CONNECT_TIMEOUT_PER_NODE = 0.1  # seconds each node may add to the wait for all of them to connect
LAST_LINE_BYTES = 64 * 2**10  # more than a stats line: the last complete one is in the file's last this many bytes
GENERATOR_STOP_TIMEOUT = 60.0  # seconds the nodes get to sign off (fleet_nodes.py JOIN_TIMEOUT: 30)
PROFILE_TOP = 12
# the files of fedbayes and Flower, as py-spy names them (relative to sys.path: the checkout's root, site-packages)
PARTS = ("bayes", "protos", "tasks", "strategies", "client", "server", "posterior", "deploy")
THEIR_PACKAGES = ("flwr/", "fedbayes/", *(f"{part}/" for part in PARTS))


@dataclass(frozen=True)
class LoadSettings:
    """One sweep's settings (the command line's)."""

    rounds: int = 6
    compute_seconds: float = 1.0
    processes: int = 4
    fraction: float = 0.05
    idle_seconds: float = 10.0
    connect_rate: float = 100.0  # nodes per second, per load generator process
    poll: float = DEFAULT_POLL  # the nodes' FEDBAYES_SUPERNODE_POLL (deploy/supernode.py)
    key_curve: str = "p256"  # the nodes' self-registered keys: fedbayes supernode's curve, or Flower's p384
    round_timeout: float = 120.0
    profile: bool = False


@dataclass
class Generator:
    """The load generator: one process and its forks (fleet_nodes.py), its files in `output`."""

    process: ManagedProcess
    output: Path
    processes: int

    def snapshots(self, index: int) -> list[dict[str, Any]]:
        """Process `index`'s stats lines, one a second."""
        return read_jsonl(self.output / f"nodes-{index}.jsonl")

    def latest(self, index: int) -> dict[str, Any] | None:
        """Process `index`'s last stats line, read from the file's end (the run's checks ask for it often)."""
        path = self.output / f"nodes-{index}.jsonl"
        if not path.exists():
            return None
        with path.open("rb") as stats:
            stats.seek(max(0, path.stat().st_size - LAST_LINE_BYTES))
            lines = [line for line in stats.read().split(b"\n")[1:-1] if line.strip()]
        return json.loads(lines[-1]) if lines else None

    def replies_sent(self) -> list[dict[str, Any]]:
        files = (self.output / f"replies-{index}.jsonl" for index in range(self.processes))
        return [reply for path in files for reply in read_jsonl(path)]

    def pids(self) -> list[int]:
        """The generator's process and its forks."""
        pid = self.process.popen.pid
        return [pid, *children(pid)]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a JSONL file another process is appending to."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line.strip()]


# ---- /proc ------------------------------------------------------------------------------------------------------
def cpu_and_rss(pid: int) -> tuple[float, int] | None:
    """(user+system CPU seconds, resident bytes) of process `pid`; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, int(fields[21]) * PAGE_BYTES


class ProcSampler(threading.Thread):
    """Every SAMPLE_INTERVAL, the CPU seconds and RSS of each process of each role (role -> pids, re-asked every
    sample: the ServerApp appears once the run is submitted)."""

    def __init__(self, roles: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.roles = roles  # role -> callable returning its pids
        self.halt = threading.Event()
        self.samples: list[tuple[float, dict[str, dict[int, tuple[float, int]]]]] = []

    def run(self) -> None:
        while not self.halt.is_set():
            sample = {}
            for role, pids in self.roles.items():
                measured = {pid: value for pid in pids() if (value := cpu_and_rss(pid)) is not None}
                sample[role] = measured
            self.samples.append((time.monotonic(), sample))
            self.halt.wait(SAMPLE_INTERVAL)

    def stop(self) -> None:
        self.halt.set()
        self.join()

    def usage(self, start: float, end: float) -> dict[str, dict[str, float]]:
        """Per role over [start, end]: cores (CPU-s per wall-s, summed over its processes; a process that ended keeps
        its last sample) and the peak RSS in MiB of one of its processes and of all together."""
        window = [(t, sample) for t, sample in self.samples if start <= t <= end]
        if len(window) < 2:
            return {}
        (first_t, first), (last_t, _) = window[0], window[-1]
        usage = {}
        for role in self.roles:
            last: dict[int, float] = {}
            peak_one = peak_all = 0
            for _, sample in window:
                for pid, (cpu, _rss) in sample.get(role, {}).items():
                    last[pid] = cpu
                rss = [value[1] for value in sample.get(role, {}).values()]
                peak_one, peak_all = max(peak_one, max(rss, default=0)), max(peak_all, sum(rss))
            spent = sum(cpu - first.get(role, {}).get(pid, (cpu, 0))[0] for pid, cpu in last.items())
            usage[role] = {
                "cores": spent / (last_t - first_t),
                "cpu_s": spent,
                "rss_mib_max": peak_one / 2**20,
                "rss_mib_max_all": peak_all / 2**20,
            }
        return usage


# ---- the nodes' counters ------------------------------------------------------------------------------------------
def node_totals(generator: Generator, moment: float | None = None) -> dict[str, Any]:
    """The nodes' counters summed over the generator's processes, each at its last stats line up to `moment` (None:
    its last)."""
    calls: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    connected, failed = 0, []
    for index in range(generator.processes):
        if moment is None:
            line = generator.latest(index)
        else:
            line = next((line for line in reversed(generator.snapshots(index)) if line["t"] <= moment), None)
        if line is None:
            continue
        connected += line["connected"]
        failed += line["failed"]
        for method, (count, spent) in line["calls"].items():
            calls[method] += count
            seconds[method] += spent
        errors.update(line["errors"])
    return {"connected": connected, "failed": failed, "calls": calls, "seconds": seconds, "errors": errors}


def call_rates(generator: Generator, start: float, end: float) -> dict[str, float]:
    """Calls per second over [start, end] of the methods that poll, and a pull's mean latency in ms."""
    before, after = node_totals(generator, start), node_totals(generator, end)
    span = max(end - start, 1e-9)
    pulls = after["calls"]["PullMessages"] - before["calls"]["PullMessages"]
    pull_seconds = after["seconds"]["PullMessages"] - before["seconds"]["PullMessages"]
    return {
        "pulls_per_s": pulls / span,
        "heartbeats_per_s": (after["calls"]["SendNodeHeartbeat"] - before["calls"]["SendNodeHeartbeat"]) / span,
        "calls_per_s": (sum(after["calls"].values()) - sum(before["calls"].values())) / span,
        "pull_ms": 1000 * pull_seconds / pulls if pulls else float("nan"),
        "errors": sum(after["errors"].values()) - sum(before["errors"].values()),
    }


# ---- profiles -----------------------------------------------------------------------------------------------------
def start_profile(pid: int, output: Path) -> subprocess.Popen:
    """py-spy sampling `pid` (every thread that holds the CPU) until it is sent SIGINT."""
    py_spy = Path(sys.executable).with_name("py-spy")
    if not py_spy.exists():
        raise SystemExit(f"--profile needs py-spy next to {sys.executable}: `{sys.executable} -m pip install py-spy`")
    command = [str(py_spy), "record", "--pid", str(pid), "--format", "raw", "--rate", "50", "--nonblocking", "--gil"]
    return subprocess.Popen([*command, "--output", str(output)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profile(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()


def profile_summary(path: Path, top: int = PROFILE_TOP) -> dict[str, Any]:
    """From py-spy's collapsed stacks (samples of the thread holding the GIL): the functions with the most own samples,
    and the innermost fedbayes or Flower function of each sample (what of theirs was running), as shares of all."""
    if not path.exists():
        return {}
    own: Counter[str] = Counter()
    innermost: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = [frame.strip() for frame in stack.split(";") if frame.strip()]
        if not frames or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        own[short_frame(frames[-1])] += count
        ours = [frame for frame in frames if frame_module(frame).startswith(THEIR_PACKAGES)]
        innermost[short_frame(ours[-1]) if ours else "(none of theirs)"] += count
    if not total:
        return {}
    return {
        "samples": total,
        "own": [(frame, count / total) for frame, count in own.most_common(top)],
        "innermost": [(frame, count / total) for frame, count in innermost.most_common(top)],
    }


def frame_module(frame: str) -> str:
    """The file of a py-spy frame `function (path/module.py:12)`, as py-spy gives it (relative to sys.path)."""
    return frame.partition(" (")[2].rstrip(")").rsplit(":", 1)[0]


def short_frame(frame: str) -> str:
    """`function (path/to/module.py:12)` -> `function (to/module.py)`: one entry per function, not per line."""
    function, module = frame.partition(" (")[0], frame_module(frame)
    return f"{function} ({'/'.join(Path(module).parts[-2:])})" if module else function


# ---- one federation, several runs ---------------------------------------------------------------------------------
def run_config(nodes: int, sampled: int, settings: LoadSettings, results: Path, federation: str) -> dict[str, Any]:
    """FedAvg with logreg, m of N nodes a round; checked as the ServerApp will check it."""
    config = {
        "strategy": "fedavg",
        "model": "logreg",
        "dataset": "fmnist",
        "fraction": settings.fraction,
        "seed": 0,
        "num-server-rounds": settings.rounds,
        "results-path": str(results),
        "federation": federation,
        "fraction-train": sampled / nodes,
        "min-clients": sampled,
        "wait-for-clients": nodes,
        "round-timeout": settings.round_timeout,
        "straggler-wait": 0.0,  # every sampled node's reply is waited for (up to round-timeout)
        "max-clients": max(nodes, 10000),
    }
    run_settings({**default_run_config("fedavg"), **config})
    return config


def start_generator(federation: LocalFederation, nodes: int, settings: LoadSettings) -> Generator:
    """The load generator's `settings.processes` processes, sharing the N nodes, in the federation's process group
    (stopped with it) and its log directory."""
    processes = min(settings.processes, nodes)
    output = federation.log_dir / "nodes"
    command = [
        sys.executable,
        str(FLEET_NODES),
        "--superlink",
        federation.fleet_address,
        "--nodes",
        str(nodes),
        "--processes",
        str(processes),
        "--compute-seconds",
        str(settings.compute_seconds),
        "--connect-rate",
        str(settings.connect_rate),
        "--poll",
        str(settings.poll),
        "--key-curve",
        settings.key_curve,
        "--output",
        str(output),
    ]
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    process = federation.processes.start("fleet-nodes", command, cwd=REPO, extra_env={"PYTHONPATH": pythonpath})
    return Generator(process, output, processes)


class CaseFailed(RuntimeError):
    """A case could not be measured: the reason is its first failure."""


def check_generator(generator: Generator) -> None:
    if generator.process.popen.poll() is not None:
        raise CaseFailed(
            f"the load generator exited with code {generator.process.popen.returncode}:\n{generator.process.log_tail()}"
        )
    failed = node_totals(generator)["failed"]
    if failed:
        raise CaseFailed(f"{len(failed)} node(s) stopped by an error; the first: {failed[0]}")


def wait_connected(generator: Generator, nodes: int, timeout: float) -> float:
    """Seconds until every node is connected (RegisterNode and ActivateNode answered)."""
    started = time.monotonic()
    while (connected := node_totals(generator)["connected"]) < nodes:
        check_generator(generator)
        if time.monotonic() - started > timeout:
            raise CaseFailed(f"only {connected} of {nodes} nodes connected within {timeout:.0f} s")
        time.sleep(0.5)
    return time.monotonic() - started


def superlink_pids(federation: LocalFederation) -> list[int]:
    return [federation.superlink.popen.pid]


def serverapp_pids(federation: LocalFederation) -> list[int]:
    """The run's ServerApp: a fork of the SuperLink's warm executor."""
    executor = federation.serverapp_superexec
    return [] if executor is None else [pid for pid in children(executor.popen.pid) if is_serverapp(pid)]


def children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def machine_load() -> dict[str, float]:
    one, five, fifteen = os.getloadavg()
    return {"load_1m": one, "load_5m": five, "load_15m": fifteen}


def measure_idle(federation: LocalFederation, generator: Generator, seconds: float, profile: bool) -> dict[str, Any]:
    """The connected federation with no run: what N idle nodes cost the SuperLink (and, with `profile`, where)."""
    sampler = ProcSampler({"superlink": lambda: superlink_pids(federation), "generators": generator.pids})
    sampler.start()
    profile_file = federation.log_dir / "profile-idle-superlink.txt"
    profiler = start_profile(federation.superlink.popen.pid, profile_file) if profile else None
    start = time.monotonic()
    time.sleep(seconds)
    end = time.monotonic()
    if profiler is not None:
        stop_profile(profiler)
    sampler.stop()
    check_generator(generator)
    profiles = {"superlink": profile_summary(profile_file)} if profiler is not None else {}
    return {**sampler.usage(start, end), **call_rates(generator, start, end), "profiles": profiles}


def run_case(
    federation: LocalFederation, generator: Generator, nodes: int, sampled: int, settings: LoadSettings
) -> dict[str, Any]:
    """One run of `settings.rounds` rounds sampling `sampled` of the `nodes` connected nodes (module docstring)."""
    name = f"{federation.workdir.name}-m{sampled}"
    results = federation.workdir / f"results-m{sampled}.jsonl"
    submit = federation.submit(run_config(nodes, sampled, settings, results, name))
    run_id = federation.run_id(submit, timeout=120)
    sampler = ProcSampler(
        {
            "superlink": lambda: superlink_pids(federation),
            "serverapp": lambda: serverapp_pids(federation),
            "generators": generator.pids,
        }
    )
    sampler.start()
    seen: dict[int, float] = {}
    profiles: dict[str, subprocess.Popen] = {}
    profile_files = {role: federation.log_dir / f"profile-m{sampled}-{role}.txt" for role in ("superlink", "serverapp")}
    deadline = time.monotonic() + 120 + settings.rounds * (settings.round_timeout + 30)
    try:
        while True:
            check_generator(generator)
            for row in read_jsonl(results):
                seen.setdefault(row["round"], time.monotonic())
            if settings.profile and 1 in seen and not profiles:
                pids = {"superlink": superlink_pids(federation), "serverapp": serverapp_pids(federation)}
                profiles = {role: start_profile(found[0], profile_files[role]) for role, found in pids.items() if found}
            if submit.popen.poll() is not None:
                break
            if time.monotonic() > deadline:
                raise CaseFailed(
                    f"run {run_id} did not end in time ({settings.rounds} rounds, round-timeout "
                    f"{settings.round_timeout:g} s)"
                )
            time.sleep(0.2)
    finally:
        for process in profiles.values():
            stop_profile(process)
        sampler.stop()
    rows = read_jsonl(results)
    status = federation.run_status(run_id)
    if submit.popen.returncode != 0 or len(rows) < settings.rounds:
        raise CaseFailed(
            f"run {run_id} ended {status.status} after {len(rows)} of {settings.rounds} rounds: "
            f"{status.details or submit.log_tail(5)}"
        )
    start, end = seen[1], seen[settings.rounds]
    replies = [reply for reply in generator.replies_sent() if reply["run_id"] == run_id]
    return {
        "run_id": run_id,
        "status": status.status,
        "rounds": len(rows),
        "rows": rows,
        "committed": committed(rows, replies, sampled),
        "window_s": end - start,
        **sampler.usage(start, end),
        **call_rates(generator, start, end),
        "profiles": {role: profile_summary(path) for role, path in profile_files.items() if role in profiles},
    }


def committed(rows: list[dict[str, Any]], replies: list[dict[str, Any]], sampled: int) -> dict[str, Any]:
    """Whether every round committed every sampled node's reply: the row accepted as many clients as it sent work to,
    `sampled` of them, refused none, and the nodes sent exactly that many replies of that round."""
    sent = Counter(reply["round"] for reply in replies)
    problems = [
        f"round {row['round']}: {row['clients']} accepted of {row['clients_sent']} sent, {sent[row['round']]} "
        f"replies, rejected {row['rejected']}"
        for row in rows
        if not row["clients"] == row["clients_sent"] == sent[row["round"]] == sampled or row["rejected"]
    ]
    return {"all": not problems, "problems": problems}


def run_nodes(nodes: int, sampled: list[int], settings: LoadSettings, root: Path) -> list[dict[str, Any]]:
    """One SuperLink and N nodes; one run per m. A row per case, with `failure` where it failed (and no later m of
    this N is run: the federation is not in a state to measure). The nodes sign off before the SuperLink stops."""
    base = {
        "nodes": nodes,
        "processes": min(settings.processes, nodes),
        "compute_seconds": settings.compute_seconds,
        "poll": settings.poll,
    }
    with LocalFederation(root / f"load-{nodes}", executor="fork") as federation:
        generator = start_generator(federation, nodes, settings)
        try:
            return [{**base, **case} for case in measure_cases(federation, generator, nodes, sampled, settings)]
        finally:
            federation.processes.stop(generator.process)
            try:
                generator.process.popen.wait(timeout=GENERATOR_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:  # the federation's exit kills it
                pass


def measure_cases(
    federation: LocalFederation, generator: Generator, nodes: int, sampled: list[int], settings: LoadSettings
) -> list[dict[str, Any]]:
    """Every node connected, the idle federation, then one run per m (`run_nodes`)."""
    try:
        connect_s = wait_connected(generator, nodes, 60 + CONNECT_TIMEOUT_PER_NODE * nodes)
        idle = measure_idle(federation, generator, settings.idle_seconds, settings.profile)
    except (CaseFailed, RunFailed, RuntimeError, TimeoutError) as error:
        return [{"sampled": m, "load": machine_load(), "failure": f"start: {error}"} for m in sampled]
    out: list[dict[str, Any]] = []
    for m in sampled:
        load = machine_load()
        try:
            case = run_case(federation, generator, nodes, m, settings)
        except (CaseFailed, RunFailed, RuntimeError, TimeoutError) as error:
            out.append({"sampled": m, "load": load, "load_after": machine_load(), "failure": str(error)})
            break
        out.append({"sampled": m, "connect_s": connect_s, "idle": idle, "load": load, **case})
        out[-1]["load_after"] = machine_load()
    return out
