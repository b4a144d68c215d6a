"""Write a fitted profile as YAML whose header documents what was measured and how well the fit holds."""

from __future__ import annotations

from datetime import UTC, datetime

import yaml

from bench.profiler.fit import COEFFICIENTS, Fit
from bench.profiler.sweep import SweepConfig

_MEANING = {
    "c_fixed": "fixed cost per step (step_overhead_s + dense_bytes / hbm_bytes_per_s)",
    "c_expert": "per distinct routed expert touched (expert_bytes / hbm_bytes_per_s)",
    "c_token": "per verified token in the step (comm_s_per_token; sampling folded in)",
    "c_context": "per context token read (kv_bytes_per_token · kv_read_replicas / hbm_bytes_per_s)",
    "d_fixed": "drafter pass, whatever the batch (drafter.fixed_s)",
    "d_seq": "drafter, per sequence (drafter.per_seq_s)",
    "d_position": "drafter, per draft position per sequence (drafter.per_position_s)",
}


def point_table(fit: Fit) -> list[str]:
    """One line per measured point: B, k, measured batch, context, measured and fitted step time, error."""
    lines = ["    B   k  batch  context  steps  measured_ms  fitted_ms  error_%"]
    for p in fit.points:
        predicted = fit.predicted_s(p)
        lines.append(
            f"  {p.batch_size:>3} {p.k:>3} {p.measured_batch:>6.2f} {p.context_tokens:>8.0f} {p.steps:>6.0f}"
            f" {p.step_s * 1e3:>12.3f} {predicted * 1e3:>10.3f} {100 * (predicted / p.step_s - 1):>8.2f}"
        )
    return lines


def render(fit: Fit, *, worker_url: str, base_name: str, config: SweepConfig) -> str:
    """The profile YAML, loadable with ``fleet.perf.load_profile``."""
    header = [
        f"Measured by `gearshift profile` from {worker_url} at {datetime.now(UTC).isoformat(timespec='seconds')}.",
        f"Grid: batch sizes {list(config.batch_sizes)} × k {list(config.ks)}; {config.window_steps} engine steps",
        f"per point, {config.prompt_words}-word prompts, temperature {config.temperature}.",
        "Step time = Δ sum / Δ count of vllm:inter_token_latency_seconds over a pure-decode window (worker clock);",
        "acceptance = Δ vllm:spec_decode_num_accepted_tokens_per_pos / Δ vllm:spec_decode_num_drafts at the",
        "largest k (made conditional per position).",
        f"Structure (experts, routing, KV replicas, bandwidth, FLOP rates) kept from the base profile {base_name};",
        "FITTED by non-negative least squares on relative error (seconds per unit):",
        *(f"  {name:<11} {fit.coefficients[name]:.4e}  {_MEANING[name]}" for name in COEFFICIENTS),
        f"Largest |fitted − measured| over the grid: {100 * fit.max_relative_error():.2f} %.",
        *point_table(fit),
    ]
    body = yaml.safe_dump(fit.profile.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
    return "".join(f"# {line}\n" if line else "#\n" for line in header) + body
