"""``python -m benchmarks memory``: what a big forest loaded through the repository API costs
the server in memory, with N workers, through reloads and an unload.

One copy is measured first: the RSS growth of a fresh Python process (scikit-learn already
imported) that loads the forest, once the loader's freed memory is trimmed. Then for each N
a server starts on an empty repository (the template preloads the model folders present at
start-up, even with ``--no-load-models-at-startup``, and this measures a model added later);
the forest's folder is put in once the server is ready. The PSS of its whole process tree
(frontend, template, workers) is read idle, after the API loaded the forest and every
worker predicted, after reloads (each after the files' mtime moved, so that each loads the
model anew), and after an unload. PSS splits a shared page between the
processes that map it, so the tree's total counts a page shared copy-on-write once.
The budget (issue 17): the PSS the model adds is at most 1.3 copies plus 60 MiB per worker.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path

import httpx
import numpy as np
import psutil

from benchmarks.loadgen.base import Target
from benchmarks.ports import free_port
from benchmarks.pss import MIB, ProcessMemory, breakdown, settle, total, tree_memory
from benchmarks.servers import (
    HOST,
    INFERPOOL_MODULE,
    RunningServer,
    ServerSpec,
    base_checkout_dir,
    command,
    wait_ready,
)

MODEL = "forest-memory"
STAGES = ("idle", "loaded", "reloaded", "unloaded")
BATCH = 256  # rows per prediction: enough work that each one shows in a worker's CPU time
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


@dataclass(frozen=True)
class ForestRecipe:
    """A RandomForestClassifier trained on generated data; the defaults make ~200 MB."""

    trees: int = 320
    samples: int = 50_000
    features: int = 50
    seed: int = 0

    @property
    def folder_name(self) -> str:
        return f"forest-t{self.trees}-s{self.samples}-f{self.features}-seed{self.seed}"


def build_forest(recipe: ForestRecipe, cache: Path) -> Path:
    """A model repository holding the recipe's forest in its folder ``MODEL``: trained once,
    then reused while the recipe and scikit-learn's version are unchanged (as the model zoo
    is). The server serves this folder itself: it refuses a model linked from elsewhere."""
    repo = cache / recipe.folder_name
    marker = repo / ".inferpool-bench-forest"
    stamp = json.dumps({"recipe": asdict(recipe), "sklearn": version("scikit-learn")})
    if marker.exists() and marker.read_text() == stamp:
        return repo
    import joblib  # only to train: scikit-learn takes seconds to import
    from sklearn.datasets import make_classification
    from sklearn.ensemble import RandomForestClassifier

    (repo / MODEL).mkdir(parents=True, exist_ok=True)
    x, y = make_classification(
        n_samples=recipe.samples,
        n_features=recipe.features,
        n_informative=min(20, recipe.features),
        random_state=recipe.seed,
    )
    forest = RandomForestClassifier(n_estimators=recipe.trees, random_state=recipe.seed, n_jobs=-1)
    forest.fit(x.astype(np.float32), y)
    forest.set_params(n_jobs=None)  # the server decides its own threads
    joblib.dump(forest, repo / MODEL / "model.joblib")
    settings = {
        "name": MODEL,
        "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": "./model.joblib"},
    }
    (repo / MODEL / "model-settings.json").write_text(json.dumps(settings, indent=2))
    marker.write_text(stamp)
    return repo


# Run in a fresh interpreter: imports first, so that only the forest's own memory counts.
# Unpickling frees temporaries that glibc keeps in its heap; malloc_trim hands them back,
# so ``kept`` is the forest's own memory (about its arrays' bytes), ``loaded`` the peak.
_ONE_COPY = """
import ctypes, gc, json, sys
import joblib, numpy, psutil, sklearn.ensemble
me = psutil.Process()
gc.collect()
before = me.memory_info().rss
forest = joblib.load(sys.argv[1])
gc.collect()
loaded = me.memory_info().rss - before
ctypes.CDLL(None).malloc_trim(0)
print(json.dumps({"loaded": loaded, "kept": me.memory_info().rss - before}))
"""


@dataclass(frozen=True)
class Copy:
    """What one copy of the forest costs a fresh process: RSS growth right after
    ``joblib.load`` (``loaded``) and once the loader's freed memory is trimmed (``kept``)."""

    loaded: int
    kept: int


def one_copy(artefact: Path) -> Copy:
    """Measure :class:`Copy` in a fresh interpreter that imported scikit-learn first."""
    done = subprocess.run(
        [sys.executable, "-c", _ONE_COPY, str(artefact)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"loading {artefact} failed: {done.stderr.strip()}")
    return Copy(**json.loads(done.stdout))


def budget(copy: int, workers: int) -> int:
    """Issue 17's bound on what the model may add: 1.3 copies plus 60 MiB per worker."""
    return int(1.3 * copy) + 60 * MIB * workers


@dataclass
class ServerMemory:
    """One server's readings: each stage's processes, or the error that stopped it."""

    name: str
    workers: int
    stages: dict[str, list[ProcessMemory]] = field(default_factory=dict)
    error: str = ""

    def pss(self, stage: str) -> int | None:
        return total(self.stages[stage]) if stage in self.stages else None

    def added(self, stage: str) -> int | None:
        """PSS over the idle server's: what the model (and its reloads) cost."""
        now, idle = self.pss(stage), self.pss("idle")
        return None if now is None or idle is None else now - idle

    def within(self, copy: int) -> bool:
        """True when the model added no more than the budget, loaded and after reloads."""
        added = [self.added("loaded"), self.added("reloaded")]
        return all(a is not None and a <= budget(copy, self.workers) for a in added)


def start_server(
    spec: ServerSpec, workdir: Path, base_checkout: Path | None
) -> tuple[RunningServer, Path]:
    """``inferpool serve`` on free ports and an empty repository, once ready; with that
    repository's folder."""
    target = Target(HOST, free_port(), free_port())
    folder = workdir / spec.name
    repo = folder / "repo"
    shutil.rmtree(repo, ignore_errors=True)  # a model left by an earlier run would preload
    repo.mkdir(parents=True)
    args = command(spec, repo, target, None, INFERPOOL_MODULE)
    env = {**os.environ, "INFERPOOL_METRICS_PORT": str(free_port()), "PYTHONUNBUFFERED": "1"}
    cwd = None
    if spec.base:
        cwd = base_checkout_dir(base_checkout)
        env["PYTHONPATH"] = str(cwd)  # its inferpool, not the one installed from here
    log_path = folder / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*args, "--no-load-models-at-startup"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            cwd=cwd,
        )
    server = RunningServer(spec, target, process, log_path)
    try:
        wait_ready(server, timeout=180.0)
    except BaseException:
        server.stop()
        raise
    return server, repo


def changed(folder: Path, step: int) -> None:
    """Move the mtime of the model's files forward, as a new copy of them would: the
    reload that follows loads the model anew rather than taking the copy it holds."""
    later = time.time() + 1 + step
    for path in folder.iterdir():
        os.utime(path, (later, later))


def add_model(source: Path, repo: Path) -> None:
    """Put the forest's folder into a running server's repository: its files hard-linked
    (copied across file systems); a symbolic link out of the repository is refused."""

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, repo / MODEL, copy_function=link)


def predict_on_every_worker(
    client: httpx.Client, root: int, workers: int, body: bytes, timeout: float = 60.0
) -> None:
    """Once the tree holds its N workers, predict until each one's CPU time grew by 20 ms:
    pages touched by serving then count. The requests go N at a time: one at a time, the
    dispatcher keeps them all on its first warm worker (``Dispatcher.pick``), and the
    others would never predict."""
    settle(root, workers)

    def predict(_: int) -> None:
        answer = client.post(f"/v2/models/{MODEL}/infer", content=body)
        if answer.status_code != 200:
            raise RuntimeError(f"predict answered {answer.status_code}: {answer.text}")

    try:
        procs = [psutil.Process(p.pid) for p in tree_memory(root) if p.role == "worker"]
        if len(procs) != workers:
            raise RuntimeError(f"the server runs {len(procs)} workers, not {workers}")
        start = {w.pid: sum(w.cpu_times()[:2]) for w in procs}
        deadline = time.monotonic() + timeout
        with ThreadPoolExecutor(workers) as pool:
            while True:
                list(pool.map(predict, range(4 * workers)))
                idle = [w.pid for w in procs if sum(w.cpu_times()[:2]) - start[w.pid] < 0.02]
                if not idle:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"workers {idle} did not predict in {timeout:.0f}s")
    except psutil.NoSuchProcess as exc:
        raise RuntimeError(f"worker {exc.pid} exited while the forest was predicted") from None


def call(client: httpx.Client, action: str) -> None:
    answer = client.post(f"/v2/repository/models/{MODEL}/{action}")
    if answer.status_code != 200:
        raise RuntimeError(f"{action} answered {answer.status_code}: {answer.text}")


def infer_body(features: int) -> bytes:
    rows = np.random.default_rng(0).normal(size=(BATCH, features)).astype(np.float32)
    tensor = {"name": "input-0", "shape": list(rows.shape), "datatype": "FP32"}
    return json.dumps({"inputs": [{**tensor, "data": rows.ravel().tolist()}]}).encode()


def measure(
    spec: ServerSpec,
    forest: Path,
    workdir: Path,
    features: int,
    reloads: int,
    base_checkout: Path | None = None,
) -> ServerMemory:
    """Start one server and read its memory at each stage (see the module's docstring)."""
    began = time.monotonic()
    result = ServerMemory(spec.name, spec.workers or 0)
    server, served = start_server(spec, workdir, base_checkout)
    assert server.pid is not None  # a server started here has a process
    root, body = server.pid, infer_body(features)

    def reading(stage: str) -> None:
        result.stages[stage] = settle(root, result.workers)
        pss = total(result.stages[stage]) / MIB
        print(f"  {spec.name} {stage}: {pss:,.0f} MiB PSS at {time.monotonic() - began:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip

    try:
        with httpx.Client(base_url=server.http_base, timeout=600.0) as client:
            reading("idle")
            add_model(forest, served)
            call(client, "load")
            predict_on_every_worker(client, root, result.workers, body)
            reading("loaded")
            for step in range(reloads):
                changed(served / MODEL, step)
                call(client, "load")
            predict_on_every_worker(client, root, result.workers, body)
            reading("reloaded")
            call(client, "unload")
            reading("unloaded")
    except (RuntimeError, httpx.HTTPError) as exc:
        result.error = f"{exc} (log: {server.log_path})"
    finally:
        server.stop()
    return result


def _mib(value: int | None, sign: str = "") -> str:
    return "-" if value is None else f"{value / MIB:{sign},.0f}"


def table(results: list[ServerMemory], copy: int, reloads: int) -> str:
    """The markdown tables: totals against the budget, then the per-process breakdown."""
    lines = [
        f"| server | N | idle | loaded (+model) | after {reloads} reloads (+model) | after "
        "unload | budget | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        verdict = f"error: {r.error}" if r.error else ("pass" if r.within(copy) else "FAIL")
        lines.append(
            f"| {r.name} | {r.workers} | {_mib(r.pss('idle'))} | {_mib(r.pss('loaded'))} "
            f"({_mib(r.added('loaded'), '+')}) | {_mib(r.pss('reloaded'))} "
            f"({_mib(r.added('reloaded'), '+')}) | {_mib(r.pss('unloaded'))} "
            f"| {_mib(budget(copy, r.workers))} | {verdict} |"
        )
    lines += [
        "",
        "PSS MiB per process (frontend / template / workers):",
        "",
        f"| server | idle | loaded | after {reloads} reloads | after unload |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        cells = [breakdown(r.stages[s]) if s in r.stages else "-" for s in STAGES]
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def commit_of(checkout: Path) -> str:
    """Short commit of a checkout, marked when its tree has uncommitted changes."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" with uncommitted changes" if git("status", "--porcelain") else "")


def section(
    body: str, argv: list[str], recipe: ForestRecipe, file_size: int, copy: Copy, context: str
) -> str:
    """The RESULTS.md section: heading, command, machine, the forest, the tables."""
    stamp = time.strftime("%Y-%m-%d (%H:%M UTC)", time.gmtime())
    return (
        f"## {stamp}: memory of a {file_size / MIB:.0f} MiB forest loaded through the API\n\n"
        f"Command: `python -m benchmarks {shlex.join(argv)}`. {context}\n\n"
        f"The forest: RandomForestClassifier, {recipe.trees} trees on {recipe.samples:,} "
        f"generated rows x {recipe.features} features (seed {recipe.seed}); file "
        f"{file_size / MIB:.0f} MiB. One copy = the RSS a fresh Python (scikit-learn "
        f"imported) grows by loading it, {copy.kept / MIB:.0f} MiB once `malloc_trim` gave "
        f"back what the loader freed ({copy.loaded / MIB:.0f} MiB before). PSS of the "
        "server's whole process tree, in MiB; `+model` is the PSS over the idle server's, and "
        "the verdict "
        "checks it (loaded and after the reloads) against the budget 1.3 x copy + 60 MiB x N.\n\n"
        f"{body}\n\n"
    )


def write_section(text: str, results_md: Path = RESULTS) -> None:
    """Insert ``text`` above the newest section (RESULTS.md lists newest first)."""
    old = results_md.read_text()
    at = old.find("\n## ")
    at = len(old) if at < 0 else at + 1
    results_md.write_text(old[:at] + text + old[at:])


def run(
    workers: list[int],
    recipe: ForestRecipe,
    cache: Path,
    workdir: Path,
    reloads: int = 5,
    base_checkout: Path | None = None,
    base_only: bool = False,
) -> tuple[list[ServerMemory], Copy, int]:
    """Measure every N (beside the base checkout's server when given; only it with
    ``base_only``): the results, one copy's cost and the artefact's file size."""
    repo = build_forest(recipe, cache).resolve()
    artefact = repo / MODEL / "model.joblib"
    suffixes = ("-base",) if base_only else ("-base", "") if base_checkout else ("",)
    results = []
    # One copy is measured in a process of its own meanwhile: it shares no page with a server.
    with ThreadPoolExecutor(1) as background:
        copy = background.submit(one_copy, artefact)
        for name in [f"inferpool-w{n}{suffix}" for n in workers for suffix in suffixes]:
            spec = ServerSpec.parse(name)
            print(f"measuring {name} ...", file=sys.stderr, flush=True)
            results.append(
                measure(spec, repo / MODEL, workdir, recipe.features, reloads, base_checkout)
            )
        return results, copy.result(), artefact.stat().st_size


def worker_counts(text: str) -> list[int]:
    """``--workers 1,2,4``: worker counts, each at least 1 (the forest is loaded into workers)."""
    try:
        counts = [int(n) for n in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of counts >= 1: {text!r}")
    return counts


def main(argv: list[str], args: argparse.Namespace) -> int:
    """``python -m benchmarks memory``: ``args`` is the parsed command line, ``argv`` its
    words (quoted in RESULTS.md as the command)."""
    if args.base_only and args.base_checkout is None:
        print("--base-only needs --base-checkout DIR", file=sys.stderr)
        return 2
    recipe = ForestRecipe(trees=args.trees, samples=args.samples)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    workdir = (args.out or Path(__file__).resolve().parent / "out" / f"memory-{stamp}").resolve()
    load_before = os.getloadavg()[0]
    base = args.base_checkout
    results, copy, size = run(
        args.workers, recipe, args.cache, workdir, args.reloads, base, args.base_only
    )
    here = commit_of(Path(__file__).resolve().parents[1])
    measured = (
        f"the base only: {commit_of(base)} ({base}), by the harness of {here}"
        if args.base_only
        else here + (f", base {commit_of(base)} ({base})" if base else "")
    )
    context = (
        f"Machine: {os.cpu_count()} cores, {psutil.virtual_memory().total / (1 << 30):.1f} GiB "
        f"RAM, load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the "
        f"end. Commit measured: {measured}."
    )
    text = section(table(results, copy.kept, args.reloads), argv, recipe, size, copy, context)
    print(text)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "results.json").write_text(
        json.dumps({"copy": asdict(copy), "file": size, "results": [asdict(r) for r in results]})
    )
    if args.write:
        write_section(text, args.results)
    return 1 if any(r.error for r in results) else 0
