"""``python -m benchmarks``: the harness's command line (run, list, repo, predict,
inprocess, memory, install-mlserver, install-kserve, install-peer, install-perf-analyzer).

Examples::

    python -m benchmarks run --quick
    python -m benchmarks run --quick --port-base 21000
    python -m benchmarks run --profile full
    python -m benchmarks run --servers inferpool-w2,mlserver-w0,kserve-w1 --only 'iris/*'
    python -m benchmarks run --servers inferpool-w2,bentoml,litserve,rayserve \
        --only 'iris/b1/rest-json/*'
    python -m benchmarks run --generator perf_analyzer --servers inferpool-w2 --only 'iris/b1/*'
    python -m benchmarks run --target http://127.0.0.1:8080 --grpc 127.0.0.1:8081 --quick
    python -m benchmarks predict --batch 256
    python -m benchmarks run --profile catboost
    python -m benchmarks inprocess --batch 1,256
    python -m benchmarks memory --workers 1,2,4 --write
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks import kserve_env, loadgen, mlserver_env, native_env, ports
from benchmarks.loadgen import perf_analyzer
from benchmarks.memory import worker_counts
from benchmarks.models import ZOO, build_repository
from benchmarks.runner import Config
from benchmarks.scenarios import PROFILES, Profile, select
from benchmarks.servers import INFERPOOL_MODULE, ServerSpec

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    commands = top.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run a profile against managed servers or a target")
    run.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    run.add_argument(
        "--quick",
        dest="profile",
        action="store_const",
        const="quick",
        help="same as --profile quick (under 2 minutes)",
    )
    run.add_argument("--servers", help="comma-separated, e.g. inferpool-w0,mlserver-w2,kserve-w1")
    run.add_argument("--baseline", help="server the ratios are against (profile's default)")
    run.add_argument(
        "--only",
        action="append",
        metavar="GLOB",
        help="scenario name glob, e.g. 'iris/b1/*/c64' (repeatable)",
    )
    run.add_argument("--duration", type=float, help="seconds per measurement")
    run.add_argument("--warmup", type=float, help="seconds of warm-up per scenario and server")
    run.add_argument("--repetitions", type=int, help="measurements per scenario and server")
    run.add_argument(
        "--interleave",
        action="store_true",
        help="measure the scenarios' repetitions in turn too (A1 B1 A2 B2 ...), so that two "
        "scenarios compare within one moment of the host",
    )
    run.add_argument(
        "--generator",
        choices=("auto", "external", "builtin", "perf_analyzer"),
        default="auto",
        help="auto: wrk/h2load when installed, else built-in; perf_analyzer: Triton's "
        "(install-perf-analyzer; rest-binary and grpc-raw scenarios, on servers that serve "
        "the model config)",
    )
    run.add_argument(
        "--port-base",
        type=int,
        metavar="N",
        help="each server's REST, gRPC and metrics ports from N upwards, in the order of "
        "--servers (3 per server), all checked free before any starts; default: free ports",
    )
    run.add_argument("--target", help="REST base URL of a running server (not managed)")
    run.add_argument("--grpc", help="host:port of the running server's gRPC endpoint")
    run.add_argument("--target-pid", type=int, help="the target's pid, to measure its RSS and CPU")
    run.add_argument("--out", type=Path, help="folder for results (default benchmarks/out/...)")
    run.add_argument("--repo", type=Path, default=OUT / "repo", help="model repository folder")
    run.add_argument(
        "--inferpool-module",
        default=INFERPOOL_MODULE,
        help="module run as `python -m MODULE serve` for inferpool-wN",
    )
    run.add_argument(
        "--base-checkout",
        type=Path,
        help="checkout that inferpool-wN-base servers run from (e.g. a git worktree of the "
        "commit before a change, its kernel built with `python setup.py build_ext --inplace`)",
    )

    listing = commands.add_parser("list", help="list a profile's scenarios")
    listing.add_argument("--profile", choices=sorted(PROFILES), default="full")

    repo = commands.add_parser("repo", help="write the model repository (to serve it yourself)")
    repo.add_argument("folder", type=Path)

    predict = commands.add_parser(
        "predict", help="time the tree models' predict: library against the tree kernel"
    )
    predict.add_argument("--batch", type=int, default=256, help="rows per predict")
    predict.add_argument("--budget", type=float, default=1.0, help="seconds per measurement")
    predict.add_argument("--repo", type=Path, default=OUT / "repo", help="model repository")

    inprocess = commands.add_parser(
        "inprocess",
        help="time CatBoost's tree kernel against its predict, and ONNX Runtime called directly",
    )
    inprocess.add_argument("--batch", type=worker_counts, default=[1, 256], help="e.g. 1,256")
    inprocess.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    inprocess.add_argument("--budget", type=float, default=0.3, help="seconds per measurement")
    inprocess.add_argument("--repo", type=Path, default=OUT / "repo", help="model repository")

    memory = commands.add_parser(
        "memory",
        help="PSS of servers with N workers and a ~200 MB forest loaded through the API",
    )
    memory.add_argument(
        "--workers", type=worker_counts, default=[1, 2, 4], help="comma-separated, e.g. 1,2,4"
    )
    memory.add_argument("--reloads", type=int, default=5, help="reloads before the third reading")
    memory.add_argument("--trees", type=int, default=320, help="trees of the forest")
    memory.add_argument("--samples", type=int, default=50_000, help="rows it is trained on")
    memory.add_argument(
        "--cache", type=Path, default=OUT / "memory", help="folder the trained forest is kept in"
    )
    memory.add_argument("--out", type=Path, help="folder for logs and results.json")
    memory.add_argument(
        "--base-checkout",
        type=Path,
        help="also measure inferpool-wN-base, run from this checkout (e.g. a git worktree)",
    )
    memory.add_argument(
        "--base-only", action="store_true", help="measure only the --base-checkout's servers"
    )
    memory.add_argument(
        "--write", action="store_true", help="add the tables to RESULTS.md (newest first)"
    )
    memory.add_argument("--results", type=Path, default=HERE / "RESULTS.md", help=argparse.SUPPRESS)

    overload = commands.add_parser(
        "overload",
        help="open-loop load at 0.5x-2x of each server's capacity (LightGBM b256 REST JSON)",
    )
    overload.add_argument("--profile", choices=("quick", "full"), default="quick")
    overload.add_argument(
        "--servers", help="comma-separated (default: inferpool-w2, and mlserver-w0 if installed)"
    )
    overload.add_argument("--out", type=Path, help="folder for results (benchmarks/out/...)")
    overload.add_argument("--repo", type=Path, default=OUT / "repo", help="model repository")
    overload.add_argument("--repetitions", type=int, help="runs per load and server (profile's)")

    large = commands.add_parser(
        "large", help="a 64 MiB FP32 tensor through an identity model: rate against memcpy"
    )
    large.add_argument(
        "--servers", default="inferpool-w2", help="comma-separated inferpool-wN[-base]"
    )
    large.add_argument("--size-mib", type=int, default=64, help="the tensor's size")
    large.add_argument("--repeat", type=int, default=5, help="round trips per protocol")
    large.add_argument("--out", type=Path, help="folder for results (benchmarks/out/...)")
    large.add_argument(
        "--base-checkout", type=Path, help="where the -base servers run from (a git worktree)"
    )

    cores = commands.add_parser(
        "cores", help="iris batch 1 CPU a request by process role, and a model of it over cores"
    )
    cores.add_argument("--servers", default="inferpool-w1,inferpool-w2", help="comma-separated")
    cores.add_argument("--duration", type=float, default=10.0, help="seconds of each measured run")
    cores.add_argument("--repetitions", type=int, default=3, help="runs per scenario and server")
    cores.add_argument("--out", type=Path, help="folder for results (benchmarks/out/...)")
    cores.add_argument("--repo", type=Path, default=OUT / "repo", help="model repository")

    commands.add_parser("install-mlserver", help="create MLServer's virtualenv now")
    commands.add_parser("install-kserve", help="create KServe's virtualenv now")
    peer = commands.add_parser("install-peer", help="create a native peer's virtualenv now")
    peer.add_argument("kind", choices=sorted(native_env.FRAMEWORKS))
    commands.add_parser(
        "install-perf-analyzer", help="download Triton's perf_analyzer into build/perf_analyzer"
    )
    return top


def profile_servers(profile: Profile) -> tuple[tuple[str, ...], str, str]:
    """The profile's servers and baseline, or its ``peerless`` ones when MLServer is not
    installed; the third item says so (empty when the peer runs)."""
    wants_mlserver = any(name.startswith("mlserver-") for name in profile.servers)
    if not profile.peerless or not wants_mlserver or mlserver_env.installed():
        return profile.servers, profile.baseline, ""
    servers = profile.peerless
    note = (
        f"MLServer is not installed (`python -m benchmarks install-mlserver` takes a few "
        f"minutes): this {profile.name} run compares inferpool's configurations "
        f"{' and '.join(servers)} instead, baseline {servers[0]}."
    )
    return servers, servers[0], note


def config_from(args: argparse.Namespace) -> Config:
    profile = PROFILES[args.profile]
    note = ""
    if args.servers:
        servers, default_baseline = tuple(args.servers.split(",")), profile.baseline
    else:
        servers, default_baseline, note = profile_servers(profile)
    for name in servers:
        ServerSpec.parse(name)  # fail early on a typo, before minutes of set-up
    baseline = args.baseline or (default_baseline if default_baseline in servers else servers[0])
    if args.target:
        servers, baseline = ("target",), "target"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Config(
        scenarios=select(profile.scenarios, args.only),
        servers=servers,
        baseline=baseline,
        duration=args.duration if args.duration is not None else profile.duration,
        warmup=args.warmup if args.warmup is not None else profile.warmup,
        repetitions=args.repetitions or profile.repetitions,
        workdir=(args.out or OUT / f"{args.profile}-{stamp}").resolve(),
        repo=args.repo.resolve(),
        generator=args.generator,
        target=args.target,
        grpc=args.grpc,
        target_pid=args.target_pid,
        inferpool_module=args.inferpool_module,
        base_checkout=args.base_checkout,
        interleave=args.interleave,
        port_base=args.port_base,
        note=note,
    )


def command_run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from benchmarks import progress, report, runner  # report pulls in matplotlib: only now

    console = Console(stderr=True)
    config = config_from(args)
    refusal = preflight(config)
    if refusal:
        console.print(f"[red]{refusal}[/]")
        return 2
    for tool in loadgen.missing_tools() if config.generator == "auto" else []:
        console.print(
            f"[yellow]{tool} is not installed: using the built-in generator "
            f"(slower, costs the server more CPU); {loadgen.INSTALL_HINT}[/]"
        )
    if config.note:
        console.print(f"[yellow]{config.note}[/]")
    console.print(
        f"{len(config.scenarios)} scenarios x {len(config.servers)} servers x "
        f"{config.repetitions} repetitions, about {config.estimate_seconds() / 60:.1f} "
        f"min of load; results in {config.workdir}"
    )
    total = len(config.scenarios) * len(config.servers) * config.repetitions
    unit = config.estimate_seconds() / max(1, total)
    with progress.for_console(console, total, unit) as bar:
        result = runner.run(config, progress=bar.step, advance=bar.advance)
    # Never wider than TABLE_WIDTH, narrower on a narrower terminal; a pipe gets the width.
    width = min(console.width, report.TABLE_WIDTH) if console.is_terminal else None
    table = Console(width=width or report.TABLE_WIDTH)
    table.print(report.rich_table(result))
    for line in [report.context(result), *report.notes(result)]:
        table.print(line, highlight=False)
    paths = report.write_files(result, config.workdir)
    for kind, path in paths.items():
        console.print(f"{kind}: {path}")
    bad = [s for s in result.summaries() if s.status == "failed" or s.errors]
    return 1 if bad else 0


def command_overload(args: argparse.Namespace) -> int:
    from benchmarks import overload

    default = ("inferpool-w2", "mlserver-w0") if mlserver_env.installed() else ("inferpool-w2",)
    servers = tuple(args.servers.split(",")) if args.servers else default
    for name in servers:
        ServerSpec.parse(name)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    config = Config(
        scenarios=(overload.SCENARIO,),
        servers=servers,
        baseline=servers[0],
        duration=0.0,
        warmup=0.0,
        repetitions=1,
        workdir=(args.out or OUT / f"overload-{args.profile}-{stamp}").resolve(),
        repo=args.repo.resolve(),
    )
    return overload.main(config, args.profile, args.repetitions)


def command_cores(args: argparse.Namespace) -> int:
    from benchmarks import cores

    servers = tuple(args.servers.split(","))
    for name in servers:
        ServerSpec.parse(name)
    config = Config(
        scenarios=cores.SCENARIOS,
        servers=servers,
        baseline=servers[0],
        duration=args.duration,
        warmup=2.0,
        repetitions=args.repetitions,
        workdir=(args.out or OUT / f"cores-{time.strftime('%Y%m%d-%H%M%S')}").resolve(),
        repo=args.repo.resolve(),
    )
    return cores.main(config)


def preflight(config: Config) -> str:
    """Why the run cannot start (a missing generator, a busy --port-base port), or ""."""
    missing = loadgen.missing_tools()
    if config.generator == "perf_analyzer" and perf_analyzer.find_binary() is None:
        return f"perf_analyzer is not installed: {perf_analyzer.INSTALL_HINT}"
    if missing and config.generator == "external":
        return f"{', '.join(missing)} not installed: {loadgen.INSTALL_HINT}"
    try:
        ports.check_free(config.port_plan())
    except (ports.PortBusy, ValueError) as exc:
        return str(exc)
    return ""


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "run":
        return command_run(args)
    if args.command == "list":
        for scenario in PROFILES[args.profile].scenarios:
            print(scenario.name)
        return 0
    if args.command == "repo":
        print(build_repository(args.folder.resolve(), sorted(ZOO)))
        return 0
    if args.command == "predict":
        from benchmarks import predict_timing

        return predict_timing.main(args.repo.resolve(), args.batch, args.budget)
    if args.command == "inprocess":
        from benchmarks import inprocess_timing

        return inprocess_timing.main(args.repo.resolve(), args.batch, args.rounds, args.budget)
    if args.command == "memory":
        from benchmarks import memory

        return memory.main(sys.argv[1:] if argv is None else argv, args)
    if args.command == "overload":
        return command_overload(args)
    if args.command == "cores":
        return command_cores(args)
    if args.command == "large":
        from benchmarks import large_tensor

        out = (args.out or OUT / f"large-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
        out.mkdir(parents=True, exist_ok=True)
        servers = args.servers.split(",")
        return large_tensor.main(servers, out, args.size_mib, args.repeat, args.base_checkout)
    if args.command == "install-kserve":
        print(kserve_env.ensure())
        return 0
    if args.command == "install-peer":
        print(native_env.ensure(args.kind))
        return 0
    if args.command == "install-perf-analyzer":
        print(perf_analyzer.install())
        return 0
    print(mlserver_env.ensure())
    return 0


if __name__ == "__main__":
    sys.exit(main())
