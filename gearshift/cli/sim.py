"""``gearshift sim …``: the simulated Kimi K3 + DSpark worker."""

from __future__ import annotations

from typing import Any

import typer
from pydantic import ValidationError

from gearshift.cli import sim_lab
from gearshift.cli.up import run_until_signalled
from workers.sim.fleet import SimFleet
from workers.sim.settings import SimWorkerSettings

sim_app = typer.Typer(help="The simulated Kimi K3 + DSpark worker.", no_args_is_help=True)
sim_app.command("figures")(sim_lab.figures_command)
sim_app.command("bench")(sim_lab.bench_command)


@sim_app.command("serve")
def serve(
    port: int | None = typer.Option(None, help="TCP port (0 = any free port). [default: 8000]"),
    host: str | None = typer.Option(None, help="Interface to listen on. [default: 127.0.0.1]"),
    worker_id: str | None = typer.Option(None, help="Worker id reported by the control API. [default: sim-0]"),
    model: str | None = typer.Option(None, help="Served model name. [default: kimi-k3]"),
    profile: str | None = typer.Option(None, help="Performance profile name or YAML path."),
    max_num_seqs: int | None = typer.Option(None, help="Most sequences in a batch. [default: 256]"),
    max_num_batched_tokens: int | None = typer.Option(None, help="Token budget per step (chunked prefill)."),
    kv_capacity_tokens: int | None = typer.Option(None, help="KV cache size in tokens."),
    context_window: int | None = typer.Option(None, help="max_model_len in tokens. [default: 1000000]"),
    scheduling: str | None = typer.Option(None, help="fcfs or priority. [default: priority]"),
    start_k: int | None = typer.Option(None, help="Start-up (fallback) speculation length. [default: k_max]"),
    seed: int | None = typer.Option(None, help="Seed of acceptance sampling and generated text. [default: 0]"),
    speedup: float | None = typer.Option(None, help="Simulated seconds per real second. [default: 1.0]"),
    default_workload: str | None = typer.Option(None, help="Acceptance class of requests that name none."),
    eos_mean_tokens: int | None = typer.Option(None, help="Mean length at which requests stop by pseudo-EOS."),
) -> None:
    """Run one simulated worker speaking vLLM's HTTP API until Ctrl-C. Unset options come from
    GEARSHIFT_SIM_* environment variables, then the defaults."""
    given: dict[str, Any] = {k: v for k, v in locals().items() if v is not None}
    try:
        settings = SimWorkerSettings(**given)
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from exc
    fleet = SimFleet([settings])
    run_until_signalled([fleet], lambda started: typer.echo("\n".join(fleet.describe())))


def register(root: typer.Typer) -> None:
    """Add ``gearshift sim …`` to the root command."""
    root.add_typer(sim_app, name="sim")
