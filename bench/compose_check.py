"""The live half of ``scripts/compose-check.sh``: once the compose stack is up, drive it as a user would and fail
an operator's failover drill.

1. Traffic through both gateways with the official ``openai`` client: ``models.list``/``retrieve``, chat and
   completions, streaming and not, sync and async, and a greedy streamed answer equal to the non-streamed one.
2. A tenant created at run time on one gateway, with a key issued there, is served by the other gateway, and its
   suspension is seen there too (``/admin/v1/tenants``).
3. The controller leader is killed (SIGKILL, so its lease is not released) and the standby is seen holding the
   lease (``gearshift_controller_leader`` 1), within two lease periods; traffic still flows after it.

Every wait is bounded; the result is one JSON object on stdout. Traffic goes only to the gateways' ports published
on 127.0.0.1; the controllers' metrics are read from inside their containers (``docker compose exec``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from openai.types.chat import ChatCompletionUserMessageParam

LEADER_METRIC = "gearshift_controller_leader"
CONTROLLERS = ("controller-1", "controller-2")


@dataclass
class Check:
    """Results, by step; ``failures`` empty means the check passed."""

    steps: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)


def wait_for(check: Callable[[], bool], *, limit_s: float, every_s: float = 0.1) -> float | None:
    """Seconds until ``check`` holds, or None when it did not within ``limit_s``."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        try:
            if check():
                return time.monotonic() - start
        except (httpx.HTTPError, subprocess.SubprocessError):
            pass
        time.sleep(every_s)
    return None


def user(text: str) -> list[ChatCompletionUserMessageParam]:
    return [{"role": "user", "content": text}]


def traffic(base_url: str, key: str, model: str, *, requests: int, check: Check, name: str) -> None:
    """The openai SDK's calls through one gateway, ``requests`` chat calls alternating streaming and not."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=60.0)
    ids = [m.id for m in client.models.list()]
    check.expect(model in ids, f"{name}: models.list has no {model}: {ids}")
    check.expect(client.models.retrieve(model).id == model, f"{name}: models.retrieve")
    prompt = user("Name three gears.")
    whole = client.chat.completions.create(model=model, messages=prompt, max_tokens=24, temperature=0)
    stream = client.chat.completions.create(model=model, messages=prompt, max_tokens=24, temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    check.expect(streamed == whole.choices[0].message.content, f"{name}: greedy streamed text differs")
    text = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8)
    check.expect(bool(text.choices[0].text), f"{name}: empty completion")
    started, tokens = time.monotonic(), 0
    for i in range(requests):
        message = user(f"request {i}")
        if i % 2:
            chunks = client.chat.completions.create(
                model=model, messages=message, max_tokens=16, stream=True, stream_options={"include_usage": True}
            )
            tokens += sum(c.usage.completion_tokens for c in chunks if c.usage is not None)
        else:
            answer = client.chat.completions.create(model=model, messages=message, max_tokens=16)
            tokens += answer.usage.completion_tokens if answer.usage else 0
    check.steps[f"{name}_chat_requests"] = requests
    check.steps[f"{name}_completion_tokens"] = tokens
    check.steps[f"{name}_chat_seconds"] = round(time.monotonic() - started, 2)
    check.expect(tokens > 0, f"{name}: no completion tokens")

    async def concurrent() -> int:
        aclient = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=60.0)
        async with aclient:
            answers = await asyncio.gather(
                *(
                    aclient.chat.completions.create(model=model, messages=user(f"async {i}"), max_tokens=8)
                    for i in range(8)
                )
            )
        return sum(1 for a in answers if a.choices)

    check.expect(asyncio.run(concurrent()) == 8, f"{name}: async requests")


def ready_at(base_url: str) -> bool:
    return httpx.get(f"{base_url}/readyz", timeout=5).status_code == 200


def status(base_url: str, key: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers, timeout=30.0).status_code


def run_time_tenant(gateways: Sequence[str], admin_key: str, model: str, check: Check) -> None:
    """Create a tenant and its key on the first gateway; the second serves it, then refuses it once suspended."""
    admin = httpx.Client(base_url=gateways[0], headers={"authorization": f"Bearer {admin_key}"}, timeout=30.0)
    with admin:
        created = admin.post("/admin/v1/tenants", json={"id": "compose-check", "tier": "batch", "rpm": 600})
        check.expect(created.status_code == 201, f"create tenant: {created.status_code} {created.text}")
        secret = admin.post("/admin/v1/keys", json={"tenant": "compose-check"}).json()["secret"]
        served = wait_for(lambda: status(gateways[1], secret, model) == 200, limit_s=5.0, every_s=0.05)
        admin.patch("/admin/v1/tenants/compose-check", json={"suspended": True})
        refused = wait_for(lambda: status(gateways[1], secret, model) == 403, limit_s=5.0, every_s=0.05)
        audit = [e["action"] for e in admin.get("/admin/v1/audit").json()["data"]]
    check.steps["run_time_tenant_served_by_other_gateway_s"] = served
    check.steps["suspension_seen_by_other_gateway_s"] = refused
    check.expect(served is not None and served <= 1.0, f"the other gateway served the new tenant after {served} s")
    check.expect(refused is not None and refused <= 1.0, f"the other gateway refused it after {refused} s")
    check.expect(audit[-3:] == ["tenant.create", "key.create", "tenant.update"], f"audit trail: {audit}")


def leader_gauge(compose: Sequence[str], service: str) -> float | None:
    """The ``gearshift_controller_leader`` value a controller exports, read inside its container."""
    code = (
        "import urllib.request;"
        "print(urllib.request.urlopen('http://127.0.0.1:9400/metrics', timeout=2).read().decode())"
    )
    out = subprocess.run(
        [*compose, "exec", "-T", service, "python", "-c", code], capture_output=True, text=True, timeout=30
    )
    for line in out.stdout.splitlines():
        if line.startswith(LEADER_METRIC + " "):
            return float(line.split()[1])
    return None


def failover(compose: Sequence[str], lease_s: float, check: Check) -> None:
    """Kill the leader with SIGKILL and time the standby's takeover (bounded by two lease periods and a margin)."""
    holders = {c: leader_gauge(compose, c) for c in CONTROLLERS}
    leaders = [c for c, v in holders.items() if v == 1.0]
    check.steps["leaders_before"] = leaders
    if len(leaders) != 1:
        check.failures.append(f"expected one leader, got {holders}")
        return
    (leader,) = leaders
    (standby,) = [c for c in CONTROLLERS if c != leader]
    subprocess.run([*compose, "kill", "-s", "SIGKILL", leader], check=True, capture_output=True, timeout=60)
    took = wait_for(lambda: leader_gauge(compose, standby) == 1.0, limit_s=2 * lease_s + 10.0, every_s=0.5)
    check.steps["killed"] = leader
    check.steps["standby_took_over_s"] = None if took is None else round(took, 1)
    check.expect(took is not None, f"{standby} did not take the lease within {2 * lease_s + 10.0} s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", action="append", required=True, help="a gateway's URL (give two)")
    parser.add_argument("--admin-key", required=True)
    parser.add_argument("--model", default="kimi-k3")
    parser.add_argument("--requests", type=int, default=40, help="chat requests per gateway")
    parser.add_argument("--lease-s", type=float, default=10.0, help="the controllers' leader lease, seconds")
    parser.add_argument("compose", nargs="+", help="the docker compose command line of the stack (after --)")
    args = parser.parse_args(argv)
    check = Check()
    gateways: list[str] = args.gateway
    for url in gateways:
        ready = wait_for(functools.partial(ready_at, url), limit_s=120.0)
        check.expect(ready is not None, f"{url} never became ready")
    with httpx.Client(base_url=gateways[0], headers={"authorization": f"Bearer {args.admin_key}"}) as admin:
        key = admin.post("/admin/v1/keys", json={"tenant": "demo"}).json()["secret"]
    for i, url in enumerate(gateways):
        traffic(url, key, args.model, requests=args.requests, check=check, name=f"gateway{i + 1}")
    run_time_tenant(gateways, args.admin_key, args.model, check)
    failover(args.compose, args.lease_s, check)
    after = [status(url, key, args.model) for url in gateways for _ in range(5)]
    check.expect(after == [200] * len(after), f"requests after the failover: {after}")
    print(json.dumps({"ok": not check.failures, "failures": check.failures, **check.steps}, indent=1))
    return 0 if not check.failures else 1


if __name__ == "__main__":
    sys.exit(main())
