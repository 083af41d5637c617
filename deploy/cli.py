"""The `fedbayes` command."""

from __future__ import annotations

import argparse
import functools
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from fedbayes.tasks.config import (
    AT_LEAST_ONE,
    MAX_REFINE_ROUNDS,
    NON_NEGATIVE,
    REFINE_ROUNDS,
    checked_number,
    run_config_number,
)


def main(argv: list[str] | None = None) -> int:
    """The `fedbayes` command.

    Args:
        argv: its arguments, after `fedbayes`; None: this process is the command (its console script or `python -m`),
            its arguments sys.argv[1:]; `local`, `run` and `superexec` then end the process without the interpreter's
            teardown.

    Returns:
        The exit status (`outcome`).

    Raises:
        SystemExit: argparse's usage errors and --help, and a refused `fedbayes local` run file (exit code 1).
    """
    whole_process = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    # `run`, `supernode` and `superlink` hand every argument to Flower's command as it is (argparse cannot pass options
    # through), and are dispatched before the parser is built, as is the fork server that forks SuperNodes: the
    # parser's subcommands import what they run (the client's, torch among it), which would cost every SuperNode about
    # 2 CPU-s and 500 MB.
    if argv[:1] == ["run"]:
        command = functools.partial(_flwr_run, argv[1:])
    elif argv[:1] == ["supernode"]:
        from fedbayes.deploy.supernode import main as supernode

        command = functools.partial(supernode, argv[1:])
    elif argv[:1] == ["superlink"]:
        from fedbayes.deploy.superlink import main as superlink

        command = functools.partial(superlink, argv[1:])
    elif argv[:1] == ["supernode-forkserver"]:
        from fedbayes.deploy.forkserver import main as forkserver

        command = functools.partial(forkserver, argv[1:])
    else:
        parser = build_parser()
        local = _local_command(parser, argv[1:]) if argv[:1] == ["local"] else None
        args = parser.parse_args(["local", *local.argv] if local else argv)
        args.local_command = local  # its run files
        args.argv = argv  # `fedbayes server` passes what follows `--` on to the SuperLink
        command = functools.partial(args.handler, args)
    from fedbayes.deploy.processes import exit_without_teardown, stop_processes_on_signals

    stop_processes_on_signals()
    # What they started is stopped by then (the warm executor's forks are signalled as it closes): no teardown needed,
    # which for a process that has imported torch is about a second of every run's exit.
    if whole_process and argv[:1] in (["local"], ["run"], ["superexec"]):
        exit_without_teardown(functools.partial(outcome, command))
    return outcome(command)


def outcome(command: Callable[[], int]) -> int:
    """The command's exit status; the errors a user can act on as one line.

    Args:
        command: the command, called with no arguments.

    Returns:
        Its exit status; 130 after Ctrl-C; 1 after RunFailed, ValueError, FileNotFoundError, RuntimeError or
        TimeoutError, whose message is printed on stderr. Other exceptions propagate.
    """
    from fedbayes.tasks.runlog import RunFailed

    try:
        return command()
    except KeyboardInterrupt:
        print("interrupted; all processes stopped", file=sys.stderr)
        return 130
    except RunFailed as error:  # its message is the one-line reason
        print(error, file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, RuntimeError, TimeoutError) as error:
        print(f"fedbayes: error: {error}", file=sys.stderr)
        return 1


def _flwr_run(argv: list[str]) -> int:
    """`fedbayes run ARGV`, a --config run file spelt out as flwr run's arguments (deploy/runfile.py)."""
    from fedbayes.deploy.flwr_run import main as flwr_run
    from fedbayes.deploy.runfile import flwr_run_argv

    def known_keys(strategy: str):
        from fedbayes.strategies import declared_keys

        return declared_keys(strategy)

    return flwr_run(flwr_run_argv(argv, known_keys))


def _local_command(parser: argparse.ArgumentParser, argv: list[str]):
    """`fedbayes local ARGV` with its run files (deploy/runfile.py); a refused file ends the command, exit code 1."""
    from fedbayes.deploy.runfile import local_command
    from fedbayes.strategies import declared_keys

    options = argparse.ArgumentParser(add_help=False)
    _add_local(options)
    try:
        return local_command(argv, options, declared_keys())
    except ValueError as error:
        parser.exit(1, f"fedbayes: error: {error}\n")


def build_parser() -> argparse.ArgumentParser:
    """The `fedbayes` command's parser, every subcommand's arguments and handler in it.

    Returns:
        The parser; each subcommand sets `handler`, which `main` calls with the parsed arguments.
    """
    parser = argparse.ArgumentParser(prog="fedbayes", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_local(commands.add_parser("local", help="run a federation of local processes over loopback gRPC"))
    commands.add_parser(
        "run",
        add_help=False,
        help="`flwr run ARGS --stream` that exits non-zero unless the run completed, and stops the simulation "
        "SuperLink it started",
    )
    _add_partitions(commands.add_parser("partitions", help="print per-client sizes and class counts of a split"))
    _add_export(
        commands.add_parser("export-partitions", help="write each client's partition to an .npz file, and the test set")
    )
    _add_strategies(commands.add_parser("strategies", help="list the strategies and the run-config keys each reads"))
    _add_presets(
        commands.add_parser(
            "presets", help="the papers' protocols: each preset's run-config values, with the source of each"
        )
    )
    _add_app(commands.add_parser("app", help="write the Flower app (DIR/pyproject.toml) for `flwr run DIR`"))
    commands.add_parser(
        "supernode",
        add_help=False,
        help="`flower-supernode ARGS` without Flower's 3 s idle sleep between pulls (deploy/supernode.py)",
    )
    commands.add_parser(
        "superlink",
        add_help=False,
        help="`flower-superlink ARGS` whose log stream ends 0.1 s, not 0.5 s, after its run (deploy/superlink.py)",
    )
    commands.add_parser(
        "supernode-forkserver",
        add_help=False,
        help="(for `fedbayes local`) import the SuperNode once, fork SuperNodes on request (deploy/forkserver.py)",
    )
    _add_superexec(
        commands.add_parser(
            "superexec",
            help="run the ClientApps of this machine's SuperNodes (or a SuperLink's ServerApps: --app serverapp) as "
            "forks of one warm process",
        )
    )
    _add_pki(commands.add_parser("pki", help="CA, SuperLink certificate and SuperNode keys (TLS + node auth)"))
    _add_client(
        commands.add_parser("client", help="join a federation from this machine (SuperNode + ClientApp executor)")
    )
    _add_server(
        commands.add_parser(
            "server",
            help="the server side of a federation across machines on this machine: the SuperLink (TLS, node "
            "authentication) and the ServerApp executor, supervised (or --check)",
        )
    )
    _add_posterior_export(
        commands.add_parser(
            "export", help="write a round's global posterior to an open file (safetensors + JSON header)"
        )
    )
    _add_predict(
        commands.add_parser(
            "predict",
            help="posterior predictive and uncertainty (entropy, mutual information) of an exported posterior",
        )
    )
    _add_report(commands.add_parser("report", help="plot runs' results (PNG) with a one-page index.html"))
    _add_compare(
        commands.add_parser(
            "compare",
            help="tune strategies on a validation split of the clients' data, run the winners over seeds, and "
            "tabulate and plot them",
        )
    )
    _add_forget(
        commands.add_parser(
            "forget",
            help="forget a client: take its contribution out of the server's state and revoke its id "
            "(or --readmit one); between rounds of a running federation",
        )
    )
    _add_inspection(commands)
    return parser


def _add_inspection(commands: argparse._SubParsersAction) -> None:
    """`fedbayes runs`, `status` and `clients` (deploy/inspection.py): what a run's files and its SuperLink say."""
    from fedbayes.deploy.inspection import add_clients_arguments, add_runs_arguments, add_status_arguments

    add_runs_arguments(
        commands.add_parser("runs", help="list the `fedbayes local` workdirs: strategy, rounds, status, last metrics")
    )
    add_status_arguments(
        commands.add_parser(
            "status",
            help="a run's round, clients accepted and left out (why), checkpoint and tracking; or a SuperLink's "
            "nodes and runs (--superlink)",
        )
    )
    add_clients_arguments(
        commands.add_parser(
            "clients", help="a federation's clients: ids, bound nodes, rounds accepted, quarantines, forgotten ids"
        )
    )


def _add_split_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", type=checked_number(int, AT_LEAST_ONE), required=True)
    parser.add_argument("--dataset", default="fmnist", help="fmnist, mnist, cifar10, cifar100, or npz:DIR")
    parser.add_argument("--data-root", default="", help="torchvision layout root ('' = Debian's Fashion-MNIST)")
    parser.add_argument(
        "--fraction",
        type=run_config_number("fraction"),
        default=1.0,
        help="fraction of the training set, in (0, 1] (0.1 = FMNIST-10%%)",
    )
    parser.add_argument("--split", default="iid", choices=("iid", "dirichlet", "two-class"))
    parser.add_argument("--seed", type=run_config_number("seed"), default=0, help="in [0, 2^32)")


def _add_local(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--rounds", type=run_config_number("num-server-rounds"), required=True)
    _add_split_arguments(parser)
    parser.add_argument(
        "--results",
        type=Path,
        metavar="FILE",
        help="JSON-lines results file (default: <workdir>/results.jsonl); one that is not empty is "
        "refused unless --set results-exists=append (this run's rows after its own) or "
        "results-exists=replace",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="logs, Flower home, server checkpoints and client state; a new or empty directory "
        "(default: runs/<time>-<strategy>), or with --resume one that holds a federation",
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=False,
        metavar="WORKDIR",
        help="continue the federation in WORKDIR (or --workdir) after its last checkpointed round, with the options "
        "and run config it was started with (WORKDIR/run.toml); what is given beside it may change only the rounds, "
        "executor, results and the run-config keys a resume may change",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="a run file (TOML): these options by name, run-config keys under [run-config]; the command line wins",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="any run-config key, e.g. proximal-mu=0.1"
    )
    parser.add_argument(
        "--preset",
        metavar="NAME",
        help="a paper's protocol (`fedbayes presets`): its run-config values for --strategy and --split, and its "
        "dataset and fraction unless given; every --set wins",
    )
    parser.set_defaults(dataset=None, fraction=None)  # given or not: a --preset supplies them when not
    parser.add_argument(
        "--executor",
        default="shared",
        choices=("shared", "fork", "subprocess"),
        help="shared (default): the ServerApp and the ClientApps fork from one warm process that serves the SuperLink "
        "and every SuperNode; fork: from a warm process per SuperNode (and one for the ServerApp); subprocess: "
        "Flower's fresh process per message (2-5 s of imports each) and per run",
    )
    parser.add_argument(
        "--parallel-tasks",
        type=checked_number(int, NON_NEGATIVE),
        default=None,
        metavar="N",
        help="at most N ClientApps compute at once (default: this machine's cores; 0: no limit)",
    )
    parser.set_defaults(handler=_run_local)


def _run_local(args: argparse.Namespace) -> int:
    from fedbayes.deploy.launcher import LocalRun, default_workdir, parse_override, run_local
    from fedbayes.deploy.presets import get_preset
    from fedbayes.deploy.runfile import local_run_config
    from fedbayes.strategies import declared_keys

    preset = get_preset(args.preset) if args.preset else None
    dataset = args.dataset or (preset.dataset if preset else "fmnist")
    fraction = args.fraction or (preset.fraction if preset else 1.0)
    from_files = local_run_config(args.local_command, declared_keys(args.strategy)) if args.local_command else {}
    overrides = {**from_files, **dict(parse_override(item) for item in args.set)}
    if preset:
        overrides = {**preset.run_config(args.strategy, args.split, args.clients), **overrides}
        print(
            f"preset {preset.name}: {preset.paper}; {dataset}, fraction {fraction}, {args.clients} clients (the "
            f"paper: {preset.clients}), {args.rounds} rounds (the paper: {preset.rounds}); `fedbayes presets "
            f"{preset.name}` lists every value and its source"
        )
    if args.data_root:
        overrides["data-root"] = args.data_root
    for key in ("data-root", "split-file"):  # made absolute: the federation's processes run in the workdir
        if isinstance(overrides.get(key), str) and overrides[key]:
            overrides[key] = str(Path(overrides[key]).resolve())
    resumed = Path(args.resume) if isinstance(args.resume, str) else None  # --resume WORKDIR
    workdir = resumed or args.workdir or default_workdir(args.strategy)
    spec = LocalRun(
        strategy=args.strategy,
        clients=args.clients,
        rounds=args.rounds,
        dataset=_absolute_npz(dataset),
        fraction=fraction,
        split=args.split,
        seed=args.seed,
        results=args.results,
        workdir=workdir,
        overrides=overrides,
        executor=args.executor,
        parallel_tasks=args.parallel_tasks,
        resume=bool(args.resume),
        resume_hint=shlex.join(["fedbayes", "local", "--resume", str(workdir)]),  # its run file says the rest
    )
    if args.local_command and args.local_command.stored:
        _say_resume_changes(args.local_command.stored, spec)
    run_local(spec)
    return 0


def _say_resume_changes(stored, spec) -> None:
    """Print what a resume changes of the run its workdir's run file describes; refuse what it may not change."""
    from fedbayes.deploy.runfile import resume_changes
    from fedbayes.server.checkpoint import RESUMABLE_KEYS
    from fedbayes.strategies import default_run_config

    changes = resume_changes(stored, spec, default_run_config(spec.strategy), RESUMABLE_KEYS)
    if changes:
        print(f"resuming as {stored.path} says, but with {'; '.join(changes)}")


def _absolute_npz(dataset: str) -> str:
    """npz:DIR with DIR made absolute: the federation's processes do not run in this directory."""
    from fedbayes.tasks.npzdata import NPZ_PREFIX, npz_folder

    folder = npz_folder(dataset)
    return dataset if folder is None or dataset == NPZ_PREFIX else f"{NPZ_PREFIX}{folder.resolve()}"


def _add_report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs",
        nargs="+",
        type=Path,
        metavar="RUN",
        help="a `fedbayes local` workdir or a results .jsonl; several are compared side by side",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="directory for the PNG plots and index.html (a new or empty one)"
    )
    _add_force(parser, "--out is not empty: write the report's files there, replacing those of the same names")
    parser.set_defaults(handler=_write_report)


def _add_compare(parser: argparse.ArgumentParser) -> None:
    """`fedbayes compare`'s options (deploy/compare.py runs it)."""
    parser.add_argument("--dataset", default="fmnist", help="fmnist, mnist, cifar10, cifar100, or npz:DIR")
    parser.add_argument("--data-root", default="", help="torchvision layout root ('' = Debian's Fashion-MNIST)")
    parser.add_argument("--clients", type=checked_number(int, AT_LEAST_ONE), required=True)
    parser.add_argument("--fraction", type=run_config_number("fraction"), default=1.0)
    parser.add_argument("--split", default="iid", choices=("iid", "dirichlet", "two-class"))
    parser.add_argument(
        "--strategies", required=True, help="comma-separated, e.g. fedavg,bayesadmm,fedlap-cov (each needs a grid)"
    )
    parser.add_argument("--rounds", type=run_config_number("num-server-rounds"), required=True)
    parser.add_argument(
        "--seeds", type=checked_number(int, AT_LEAST_ONE), default=3, help="the winners run on seeds 0..S-1 (default 3)"
    )
    parser.add_argument(
        "--grid",
        default="small",
        help="defaults: 1 point a strategy, nothing tuned; small: 2 points; paper: 8 (compare_grids.toml)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="the runs, table, figures and summary; run again to resume"
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="any run-config key, for every run"
    )
    parser.add_argument(
        "--parallel",
        type=checked_number(int, AT_LEAST_ONE),
        default=1,
        metavar="N",
        help="federations run at once, each in a subprocess (default 1: one at a time, in this process)",
    )
    parser.set_defaults(handler=_compare)


def _compare(args: argparse.Namespace) -> int:
    from fedbayes.deploy.compare import run

    return run(args)


def _add_force(parser: argparse.ArgumentParser, does: str) -> None:
    """--force, whose help says what it does instead of refusing (no command overwrites anything without it)."""
    parser.add_argument("--force", action="store_true", help=f"when {does} (refused otherwise)")


def _write_report(args: argparse.Namespace) -> int:
    from fedbayes.tasks.report import PLOTS, REPORT_FILES, load_runs, write_report
    from fedbayes.tasks.storage import check_output_folder

    check_output_folder(args.out, REPORT_FILES, args.force)
    index = write_report(load_runs(args.runs), args.out)
    print(f"wrote {', '.join(plot.file for plot in PLOTS)} and {index}")
    return 0


def _add_forget(parser: argparse.ArgumentParser) -> None:
    from fedbayes.posterior.cli import add_named_code_arguments

    parser.add_argument(
        "run",
        type=Path,
        metavar="RUN",
        help="a `fedbayes local` workdir, or a server state directory with --federation",
    )
    parser.add_argument("--federation", help="the federation's name, when RUN is a server state directory")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--client", metavar="ID", help="the client id to forget")
    who.add_argument("--readmit", metavar="ID", help="let a forgotten client id take part again, as a new client")
    parser.add_argument(
        "--refine-rounds",
        type=checked_number(int, REFINE_ROUNDS),
        default=0,
        metavar="R",
        help="the federation runs at least R ordinary rounds among the remaining clients after the "
        f"forget (a resume raises num-server-rounds if needed); 0 to {MAX_REFINE_ROUNDS}",
    )
    parser.add_argument(
        "--wait",
        type=checked_number(float, NON_NEGATIVE),
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for a running federation to settle the request (default 600)",
    )
    parser.add_argument("--data-root", help="where the run's dataset is, if not where its run config says")
    add_named_code_arguments(parser)  # a stopped federation's server is rebuilt from its checkpoint's run config
    parser.set_defaults(handler=_forget)


def _forget(args: argparse.Namespace) -> int:
    from fedbayes.posterior.cli import named_code
    from fedbayes.posterior.export import locate_run
    from fedbayes.server.forget import ForgetRequest, audit_path, describe_outcome, forget_command

    if args.readmit and args.refine_rounds:
        raise ValueError("--refine-rounds goes with --client (a readmission changes no state to refine)")
    client = args.client if args.readmit is None else args.readmit
    location = locate_run(args.run, args.federation, named_code(args))
    request = ForgetRequest.by_operator(
        location.federation, client, args.refine_rounds, readmit=args.readmit is not None
    )
    record = forget_command(location, request, args.wait, args.data_root)
    print(describe_outcome(record, audit_path(location)))
    return 0


def _add_superexec(parser: argparse.ArgumentParser) -> None:
    from fedbayes.deploy.warm_executor import add_arguments, run

    add_arguments(parser)
    parser.set_defaults(handler=run)


def _add_client(parser: argparse.ArgumentParser) -> None:
    from fedbayes.deploy.client import add_arguments, run

    add_arguments(parser)
    parser.set_defaults(handler=run)


def _add_server(parser: argparse.ArgumentParser) -> None:
    from fedbayes.deploy.server import add_arguments, run

    add_arguments(parser)
    parser.set_defaults(handler=run)


def _add_posterior_export(parser: argparse.ArgumentParser) -> None:
    from fedbayes.posterior.cli import add_export_arguments

    add_export_arguments(parser)


def _add_predict(parser: argparse.ArgumentParser) -> None:
    from fedbayes.posterior.cli import add_predict_arguments

    add_predict_arguments(parser)


def _add_pki(parser: argparse.ArgumentParser) -> None:
    from fedbayes.deploy.pki import add_arguments, run

    add_arguments(parser)
    parser.set_defaults(handler=run)


def _add_partitions(parser: argparse.ArgumentParser) -> None:
    _add_split_arguments(parser)
    parser.add_argument(
        "--write",
        type=Path,
        metavar="F",
        help="also write the split as JSON (per client its row indices) for run config split-file",
    )
    _add_force(parser, "the --write file exists: replace it")
    parser.add_argument(
        "--split-file", type=Path, metavar="F", help="describe (and check) the split in F instead of drawing one"
    )
    parser.add_argument(
        "--allow-overlap", action="store_true", help="with --split-file: rows may be in several clients"
    )
    parser.set_defaults(handler=_print_partitions)


def _add_strategies(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="STRATEGY", help="only these (default: all, and the core keys)")
    parser.set_defaults(handler=_print_strategies)


def _print_strategies(args: argparse.Namespace) -> int:
    from fedbayes.deploy.flower_app import describe_strategies

    print(describe_strategies(args.names))
    return 0


def _add_presets(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", default="", metavar="PRESET", help="this one's values (default: list them)")
    parser.add_argument("--strategy", default="", help="only this strategy's values, also as a `-c` string")
    parser.add_argument("--split", default="", help="the split the values are for (default: the preset's first)")
    parser.add_argument(
        "--clients", type=checked_number(int, AT_LEAST_ONE), default=0, help="for values that depend on it"
    )
    parser.set_defaults(handler=_print_presets)


def _print_presets(args: argparse.Namespace) -> int:
    from fedbayes.deploy.presets import describe

    print(describe(args.name, args.strategy, args.split, args.clients))
    return 0


def _add_app(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", type=Path)
    _add_force(parser, "DIRECTORY holds a pyproject.toml: replace it")
    parser.add_argument(
        "--strategy",
        default="",
        help="also list this out-of-tree strategy's own keys ('<module>:<attribute>' or entry point)",
    )
    parser.set_defaults(handler=_write_app)


def _write_app(args: argparse.Namespace) -> int:
    from fedbayes.deploy.flower_app import APP_FILE, write_app
    from fedbayes.tasks.storage import check_new_files

    check_new_files([args.directory / APP_FILE], args.force)
    print(write_app(args.directory, args.strategy) / APP_FILE)
    return 0


def _add_export(parser: argparse.ArgumentParser) -> None:
    _add_split_arguments(parser)
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="directory for client-<i>.npz and test.npz (then usable as --dataset npz:DIR); a new or empty one",
    )
    _add_force(parser, "--out is not empty: write the files there, replacing those of the same names")
    parser.set_defaults(handler=_export_partitions)


def _split(args: argparse.Namespace):
    from fedbayes.tasks.datasets import load_dataset
    from fedbayes.tasks.partitions import partition_dataset

    train = load_dataset(args.dataset, train=True, data_root=args.data_root)
    labels = train.labels.numpy()
    return train, partition_dataset(labels, args.clients, args.split, args.seed, fraction=args.fraction)


def _print_partitions(args: argparse.Namespace) -> int:
    from fedbayes.tasks.datasets import load_dataset
    from fedbayes.tasks.partitions import describe_partitions, read_split_file, write_split_file
    from fedbayes.tasks.storage import check_new_files

    if args.write:
        check_new_files([args.write], args.force)
    if args.split_file:
        train = load_dataset(args.dataset, train=True, data_root=args.data_root)
        partitions = read_split_file(args.split_file, len(train), args.clients, args.allow_overlap)
    else:
        train, partitions = _split(args)
    print(describe_partitions(partitions, train.labels.numpy(), train.num_classes))
    if args.write:
        write_split_file(args.write, partitions)
        print(f"wrote the split of {len(partitions)} clients to {args.write}")
    return 0


def _export_partitions(args: argparse.Namespace) -> int:
    """client-<i>.npz per client and test.npz: a folder for dataset npz:DIR, a client's data-path file each."""
    from fedbayes.tasks.datasets import load_dataset
    from fedbayes.tasks.npzdata import TEST_FILE, client_file, data_files, write_npz
    from fedbayes.tasks.storage import check_output_folder, listed

    names = [*(client_file(args.out, index).name for index in range(args.clients)), TEST_FILE]
    check_output_folder(args.out, names, args.force)
    others = [name for name in data_files(args.out) if name not in names]
    if others:  # left beside the new files, they would make the folder another dataset than this split
        raise ValueError(
            f"{args.out} holds {listed(others)}, which an export of {args.clients} clients does not replace: "
            "the folder would then hold other partitions than this split's; remove them, or write to a new folder"
        )
    train, partitions = _split(args)
    for index, indices in enumerate(partitions):
        write_npz(client_file(args.out, index), train.subset(indices))
    write_npz(args.out / TEST_FILE, load_dataset(args.dataset, train=False, data_root=args.data_root))
    print(f"wrote {len(partitions)} partitions and {TEST_FILE} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
