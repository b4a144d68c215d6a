"""The speculation-control API (DESIGN §3.1), lease expiry, workload routing and client disconnects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from bench.procs import wait_until
from fleet.speculation import SPECULATION_PATH

from .server_helpers import CONTROL_TOKEN, ThreadedSimServer, metric_value

AUTH = {"Authorization": f"Bearer {CONTROL_TOKEN}"}


def test_get_shows_the_start_up_schedule(http: httpx.Client, start_sim: Callable[..., ThreadedSimServer]) -> None:
    url = start_sim(worker_id="w-7", start_k=5, max_num_seqs=64).url
    state = http.get(url + SPECULATION_PATH).json()
    assert state["worker_id"] == "w-7"
    assert state["method"] == "dspark"
    assert state["k_max"] == 7
    assert state["schedule"] == state["fallback_schedule"] == [[1, 64, 5]]
    assert state["version"] == 0
    assert state["lease_expires_at"] is None


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": CONTROL_TOKEN}])
def test_put_without_the_control_token_is_401(http: httpx.Client, sim_url: str, headers: dict[str, str]) -> None:
    resp = http.put(sim_url + SPECULATION_PATH, json={"k": 2, "version": 1}, headers=headers)
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == 401


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"schedule": [[1, 10, 4], [12, 256, 2]], "version": 1}, "gap"),
        ({"schedule": [[1, 10, 4], [5, 256, 2]], "version": 1}, "overlap"),
        ({"schedule": [[1, 256, 9]], "version": 1}, "k_max"),
        ({"schedule": [[1, 256, -1]], "version": 1}, "negative"),
        ({"k": 3, "schedule": [[1, 256, 3]], "version": 1}, "exactly one"),
        ({"k": 3}, "version"),
        ({"k": 3, "version": 1, "colour": "red"}, "colour"),
    ],
)
def test_bad_tables_are_400_with_a_message(
    http: httpx.Client, sim_url: str, body: dict[str, object], needle: str
) -> None:
    resp = http.put(sim_url + SPECULATION_PATH, json=body, headers=AUTH)
    assert resp.status_code == 400
    assert needle in resp.json()["error"]["message"]


def test_put_applies_is_idempotent_and_rejects_older_versions(
    http: httpx.Client, start_sim: Callable[..., ThreadedSimServer]
) -> None:
    url = start_sim().url
    body = {"schedule": [[1, 4, 7], [5, 256, 2]], "version": 3, "lease_seconds": 60, "reason": "test"}
    applied = http.put(url + SPECULATION_PATH, json=body, headers=AUTH)
    assert applied.status_code == 200
    assert applied.json()["schedule"] == [[1, 4, 7], [5, 256, 2]]
    assert http.put(url + SPECULATION_PATH, json=body, headers=AUTH).status_code == 200
    older = http.put(url + SPECULATION_PATH, json={"k": 1, "version": 2}, headers=AUTH)
    assert older.status_code == 409
    state = http.get(url + SPECULATION_PATH).json()
    assert (state["version"], state["reason"]) == (3, "test")
    assert metric_value(http, url, "gearshift_worker_spec_version") == 3
    assert metric_value(http, url, "gearshift_worker_spec_k", from_bs="5", to_bs="256") == 2


def test_applied_k_is_used_by_the_engine(http: httpx.Client, start_sim: Callable[..., ThreadedSimServer]) -> None:
    url = start_sim(start_k=0).url
    http.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 20}, timeout=30).raise_for_status()
    assert metric_value(http, url, "vllm:spec_decode_num_drafts_total") == 0
    http.put(url + SPECULATION_PATH, json={"k": 3, "version": 1}, headers=AUTH).raise_for_status()
    http.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 20}, timeout=30).raise_for_status()
    drafts = metric_value(http, url, "vllm:spec_decode_num_drafts_total")
    assert drafts > 0
    assert metric_value(http, url, "vllm:spec_decode_num_draft_tokens_total") == 3 * drafts


def test_an_expired_lease_reverts_to_the_fallback(
    http: httpx.Client, start_sim: Callable[..., ThreadedSimServer]
) -> None:
    url = start_sim(start_k=4).url
    applied = http.put(url + SPECULATION_PATH, json={"k": 1, "version": 1, "lease_seconds": 0.5}, headers=AUTH).json()
    assert applied["schedule"] == [[1, 256, 1]]
    assert applied["lease_expires_at"] == pytest.approx(applied["applied_at"] + 0.5)
    assert wait_until(lambda: http.get(url + SPECULATION_PATH).json()["schedule"] == [[1, 256, 4]], timeout_s=10.0)
    state = http.get(url + SPECULATION_PATH).json()
    assert (state["version"], state["lease_expires_at"]) == (1, None)
    assert "lease expired" in state["reason"]
    assert metric_value(http, url, "gearshift_worker_spec_lease_expired_total") == 1


def test_workload_comes_from_the_header_or_the_body(
    http: httpx.Client, start_sim: Callable[..., ThreadedSimServer]
) -> None:
    url = start_sim(start_k=7, default_workload="random").url

    def mean_accepted_length(**kwargs: Any) -> float:
        before = [metric_value(http, url, f"vllm:spec_decode_num_{c}_total") for c in ("drafts", "accepted_tokens")]
        http.post(url + "/v1/completions", timeout=30, **kwargs).raise_for_status()
        after = [metric_value(http, url, f"vllm:spec_decode_num_{c}_total") for c in ("drafts", "accepted_tokens")]
        return 1 + (after[1] - before[1]) / (after[0] - before[0])

    body = {"prompt": "p", "max_tokens": 300}
    default = mean_accepted_length(json=body)
    maths_header = mean_accepted_length(json=body, headers={"x-gearshift-workload": "maths"})
    maths_field = mean_accepted_length(json={**body, "gearshift_workload": "maths"})
    assert maths_header > default + 1
    assert maths_field > default + 1


def test_priority_needs_priority_scheduling_like_vllm(
    http: httpx.Client, start_sim: Callable[..., ThreadedSimServer]
) -> None:
    url = start_sim(scheduling="fcfs").url
    resp = http.post(url + "/v1/completions", json={"prompt": "p", "max_tokens": 2, "priority": 1})
    assert resp.status_code == 400
    assert "priority" in resp.json()["error"]["message"].lower()
    ok = http.post(url + "/v1/completions", json={"prompt": "p", "max_tokens": 2, "priority": 0}, timeout=30)
    assert ok.status_code == 200


def _engine_idle(http: httpx.Client, url: str) -> bool:
    running = metric_value(http, url, "vllm:num_requests_running")
    return running == 0 and metric_value(http, url, "vllm:num_requests_waiting") == 0


def test_a_dropped_stream_aborts_its_request(http: httpx.Client, start_sim: Callable[..., ThreadedSimServer]) -> None:
    url = start_sim(speedup=5).url
    body = {"prompt": "long", "max_tokens": 20_000, "stream": True}
    with http.stream("POST", url + "/v1/completions", json=body) as resp:
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        assert metric_value(http, url, "vllm:num_requests_running") == 1
    assert wait_until(lambda: _engine_idle(http, url), timeout_s=10.0)
    assert metric_value(http, url, "vllm:generation_tokens_total") < 20_000


def test_a_dropped_unstreamed_request_is_aborted(
    http: httpx.Client, start_sim: Callable[..., ThreadedSimServer]
) -> None:
    url = start_sim(speedup=5).url
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 20_000},
            timeout=0.5,
        )
    assert wait_until(lambda: _engine_idle(http, url), timeout_s=10.0)
    assert metric_value(http, url, "vllm:generation_tokens_total") < 20_000
