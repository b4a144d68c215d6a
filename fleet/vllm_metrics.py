"""Names of the vLLM 0.32 metrics that gearshift reads and that the simulated worker exports.

Every part of gearshift refers to a vLLM metric through these constants, so a rename in a vLLM upgrade
edits this one file. Each constant is the *family* name as Prometheus exposes it: counters carry a
``_total`` suffix in the exposition, histograms ``_bucket``/``_sum``/``_count``.
All of them carry the labels ``engine`` and ``model_name``.
"""

from typing import Final

LABEL_ENGINE: Final = "engine"
LABEL_MODEL: Final = "model_name"
LABEL_POSITION: Final = "position"
LABEL_REASON: Final = "reason"

# Speculative decoding counters (counters; exposition adds `_total`).
SPEC_DECODE_NUM_DRAFTS: Final = "vllm:spec_decode_num_drafts"
SPEC_DECODE_NUM_DRAFT_TOKENS: Final = "vllm:spec_decode_num_draft_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS: Final = "vllm:spec_decode_num_accepted_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS: Final = "vllm:spec_decode_num_accepted_tokens_per_pos"

# Scheduler state (gauges).
NUM_REQUESTS_RUNNING: Final = "vllm:num_requests_running"
NUM_REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
NUM_REQUESTS_WAITING_BY_REASON: Final = "vllm:num_requests_waiting_by_reason"
KV_CACHE_USAGE_PERC: Final = "vllm:kv_cache_usage_perc"

# Counters.
NUM_PREEMPTIONS: Final = "vllm:num_preemptions"
GENERATION_TOKENS: Final = "vllm:generation_tokens"
PROMPT_TOKENS: Final = "vllm:prompt_tokens"
# Prefix caching (counters, tokens): queried and found cached at each request's first scheduling, and the cached
# prompt tokens counted with ``vllm:prompt_tokens`` (vLLM 0.32 ``v1/metrics/loggers.py``).
PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits"
PROMPT_TOKENS_CACHED: Final = "vllm:prompt_tokens_cached"

# Histograms.
ITERATION_TOKENS: Final = "vllm:iteration_tokens_total"  # a histogram whose family name ends in _total
TIME_TO_FIRST_TOKEN: Final = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY: Final = "vllm:inter_token_latency_seconds"
REQUEST_TIME_PER_OUTPUT_TOKEN: Final = "vllm:request_time_per_output_token_seconds"
E2E_REQUEST_LATENCY: Final = "vllm:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME: Final = "vllm:request_queue_time_seconds"

# Worker metrics gearshift adds beside vLLM's (DESIGN §3.1).
WORKER_SPEC_K: Final = "gearshift_worker_spec_k"  # gauge, labels from_bs, to_bs
WORKER_SPEC_VERSION: Final = "gearshift_worker_spec_version"  # gauge
WORKER_SPEC_LEASE_EXPIRED: Final = "gearshift_worker_spec_lease_expired"  # counter
# gauge: 1 when the engine sizes verification per step itself (adaptive verification)
WORKER_ADAPTIVE_VERIFICATION: Final = "gearshift_worker_adaptive_verification"

VLLM_CONSUMED: Final = (
    SPEC_DECODE_NUM_DRAFTS,
    SPEC_DECODE_NUM_DRAFT_TOKENS,
    SPEC_DECODE_NUM_ACCEPTED_TOKENS,
    SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    NUM_REQUESTS_WAITING_BY_REASON,
    KV_CACHE_USAGE_PERC,
    NUM_PREEMPTIONS,
    ITERATION_TOKENS,
    GENERATION_TOKENS,
    PROMPT_TOKENS,
    TIME_TO_FIRST_TOKEN,
    INTER_TOKEN_LATENCY,
    REQUEST_TIME_PER_OUTPUT_TOKEN,
    E2E_REQUEST_LATENCY,
    REQUEST_QUEUE_TIME,
)
"""Every vLLM metric family the controller consumes (DESIGN §3.2)."""
