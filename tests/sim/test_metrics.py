"""The simulated worker's /metrics text, parsed back with prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from fleet import vllm_metrics as names
from fleet.speculation import SpeculationUpdate
from workers.sim.engine import EngineCore
from workers.sim.exposition import SimWorkerMetrics, render

from .engine_helpers import make_engine, req, run_to_completion

VLLM_LABELS = {"engine": "0", "model_name": "kimi-k3"}

EXPECTED_TYPES = {
    names.SPEC_DECODE_NUM_DRAFTS: "counter",
    names.SPEC_DECODE_NUM_DRAFT_TOKENS: "counter",
    names.SPEC_DECODE_NUM_ACCEPTED_TOKENS: "counter",
    names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS: "counter",
    names.NUM_REQUESTS_RUNNING: "gauge",
    names.NUM_REQUESTS_WAITING: "gauge",
    names.NUM_REQUESTS_WAITING_BY_REASON: "gauge",
    names.KV_CACHE_USAGE_PERC: "gauge",
    names.NUM_PREEMPTIONS: "counter",
    names.ITERATION_TOKENS: "histogram",
    names.GENERATION_TOKENS: "counter",
    names.PROMPT_TOKENS: "counter",
    names.TIME_TO_FIRST_TOKEN: "histogram",
    names.INTER_TOKEN_LATENCY: "histogram",
    names.REQUEST_TIME_PER_OUTPUT_TOKEN: "histogram",
    names.E2E_REQUEST_LATENCY: "histogram",
    names.REQUEST_QUEUE_TIME: "histogram",
    names.WORKER_SPEC_K: "gauge",
    names.WORKER_SPEC_VERSION: "gauge",
    names.WORKER_SPEC_LEASE_EXPIRED: "counter",
}


def _samples(text: str) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for fam in text_string_to_metric_families(text):
        out.setdefault(fam.name, []).extend(fam.samples)
    return out


def _types(text: str) -> dict[str, str]:
    return {fam.name: fam.type for fam in text_string_to_metric_families(text)}


def _value(samples: list[Sample], name: str, **labels: str) -> float:
    matching = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matching) == 1, (name, labels, samples)
    return matching[0]


def _busy_engine() -> EngineCore:
    engine = make_engine(schedule=((1, 4, 6), (5, 256, 3)), kv_capacity_tokens=1024, seed=4)
    for i in range(6):
        engine.add(req(f"r{i}", prompt=150, max_tokens=80, workload="code"))
    run_to_completion(engine)
    engine.add(req("late", max_tokens=10))
    return engine


def test_every_consumed_family_is_exported_with_vllms_type() -> None:
    engine = _busy_engine()
    text = render(engine.stats, engine.control, model_name="kimi-k3").decode()
    types = _types(text)
    for name, kind in EXPECTED_TYPES.items():
        assert types.get(name) == kind, f"{name}: expected {kind}, got {types.get(name)}"
    assert set(names.VLLM_CONSUMED) <= set(types)


def test_exposed_sample_names_and_labels_match_vllm() -> None:
    engine = _busy_engine()
    text = render(engine.stats, engine.control, model_name="kimi-k3").decode()
    st = engine.stats
    samples = _samples(text)
    drafts = samples[names.SPEC_DECODE_NUM_DRAFTS]
    assert _value(drafts, "vllm:spec_decode_num_drafts_total", **VLLM_LABELS) == st.num_drafts
    accepted = samples[names.SPEC_DECODE_NUM_ACCEPTED_TOKENS]
    assert _value(accepted, "vllm:spec_decode_num_accepted_tokens_total", **VLLM_LABELS) == st.num_accepted_tokens
    per_pos = samples[names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS]
    assert {s.labels["position"] for s in per_pos} == {str(i) for i in range(7)}
    for i, count in enumerate(st.accepted_per_pos):
        name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        assert _value(per_pos, name, position=str(i), **VLLM_LABELS) == count
    by_reason = samples[names.NUM_REQUESTS_WAITING_BY_REASON]
    assert {s.labels["reason"] for s in by_reason} == {"capacity", "deferred"}
    assert sum(s.value for s in by_reason) == _value(samples[names.NUM_REQUESTS_WAITING], names.NUM_REQUESTS_WAITING)
    assert _value(samples[names.NUM_PREEMPTIONS], "vllm:num_preemptions_total") == st.num_preemptions > 0
    for fam in EXPECTED_TYPES:
        if fam.startswith("vllm:"):
            assert all(VLLM_LABELS.items() <= s.labels.items() for s in samples[fam]), fam


def test_iteration_tokens_histogram_counts_engine_steps() -> None:
    engine = _busy_engine()
    samples = _samples(render(engine.stats, engine.control, model_name="kimi-k3").decode())
    it = samples[names.ITERATION_TOKENS]
    assert _value(it, "vllm:iteration_tokens_total_count") == engine.stats.steps
    assert _value(it, "vllm:iteration_tokens_total_bucket", le="+Inf") == engine.stats.steps
    bounds = [s.labels["le"] for s in it if s.name.endswith("_bucket")]
    assert bounds[:3] == ["1.0", "8.0", "16.0"]
    ttft = samples[names.TIME_TO_FIRST_TOKEN]
    assert _value(ttft, "vllm:time_to_first_token_seconds_count") == 6


def test_speculation_schedule_version_and_lease_expiries_are_exported() -> None:
    engine = _busy_engine()
    metrics = SimWorkerMetrics(lambda: engine.stats, engine.control, model_name="kimi-k3")
    engine.control.apply(SpeculationUpdate(schedule=[[1, 8, 5], [9, 256, 1]], version=3, lease_seconds=10))
    samples = _samples(metrics.render().decode())
    k_rows = {(s.labels["from_bs"], s.labels["to_bs"]): s.value for s in samples[names.WORKER_SPEC_K]}
    assert k_rows == {("1", "8"): 5.0, ("9", "256"): 1.0}
    assert _value(samples[names.WORKER_SPEC_VERSION], names.WORKER_SPEC_VERSION) == 3
    expired = samples[names.WORKER_SPEC_LEASE_EXPIRED]
    assert _value(expired, "gearshift_worker_spec_lease_expired_total") == 0


def test_scrapes_see_live_values() -> None:
    engine = make_engine()
    metrics = SimWorkerMetrics(lambda: engine.stats, engine.control, model_name="m")
    before = _samples(metrics.render().decode())
    engine.add(req("r"))
    after = _samples(metrics.render().decode())
    assert _value(before[names.NUM_REQUESTS_WAITING], names.NUM_REQUESTS_WAITING) == 0
    assert _value(after[names.NUM_REQUESTS_WAITING], names.NUM_REQUESTS_WAITING, model_name="m") == 1
