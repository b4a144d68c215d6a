"""Fuzzing the gateway: schemathesis over its OpenAPI schema, and hypothesis-generated hostile completion
bodies. Pass conditions: no 5xx from the gateway, responses that conform to the schema, and every 4xx an
OpenAI error object (``{"error": {"message": str, "type": str, …}}``).

The gateway's generated schema does not declare the completion request bodies (they are read as raw bytes
for speed), so ``with_completion_bodies`` adds an OpenAI-shaped request schema to those two operations before
schemathesis sees it; the hostile-body fuzzer covers what that schema does not (wrong types, huge numbers,
deep nesting, unknown fields).
"""

from __future__ import annotations

import contextlib
import copy
import secrets
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.procs import Proc, start_gateway, start_sim
from fleet.config import key_digest

MODEL = "kimi-k3"
MESSAGE = {
    "type": "object",
    "properties": {
        "role": {"enum": ["system", "user", "assistant"]},
        "content": {"type": "string", "maxLength": 200},
    },
    "required": ["role", "content"],
}
COMPLETION_FIELDS: dict[str, Any] = {
    "model": {"enum": [MODEL, "no-such-model"]},
    "max_tokens": {"type": "integer", "minimum": -2, "maximum": 64},
    "n": {"type": "integer", "minimum": -1, "maximum": 4},
    "temperature": {"type": "number", "minimum": -1, "maximum": 3},
    "stream": {"type": "boolean"},
}
CHAT_BODY = {
    "type": "object",
    "properties": {"messages": {"type": "array", "items": MESSAGE, "maxItems": 4}, **COMPLETION_FIELDS},
    "required": ["model", "messages"],
}
TEXT_BODY = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "maxLength": 200}, **COMPLETION_FIELDS},
    "required": ["model", "prompt"],
}


def with_completion_bodies(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of the gateway's OpenAPI document with request bodies on the two completion operations."""
    doc = copy.deepcopy(schema)
    for path, body in (("/v1/chat/completions", CHAT_BODY), ("/v1/completions", TEXT_BODY)):
        op = doc.get("paths", {}).get(path, {}).get("post")
        if op is not None and "requestBody" not in op:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return doc


def openai_error_problem(status: int, body: bytes) -> str | None:
    """Why a response is not acceptable, or None: 5xx, or a 4xx without an OpenAI error object."""
    if status >= 500:
        return f"server error {status}: {body[:300]!r}"
    if status < 400:
        return None
    try:
        err = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return f"{status} without a JSON error body: {body[:300]!r}"
    if not isinstance(err, dict) or not isinstance(err.get("message"), str) or not isinstance(err.get("type"), str):
        return f"{status} error body is not OpenAI-shaped: {body[:300]!r}"
    return None


# --------------------------------------------------------------------------------------- hostile bodies
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=50),
)  # fmt: skip
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def hostile_chat_body(draw: st.DrawFn) -> bytes:
    """A chat completion body that is sometimes valid, often wrong in one or more fields, sometimes not JSON."""
    if draw(st.integers(0, 19)) == 0:
        return draw(st.binary(max_size=200))
    body: dict[str, Any] = {
        "model": draw(st.sampled_from([MODEL, MODEL, "", "../../etc", 7, None])),
        "messages": draw(
            st.one_of(
                st.just([{"role": "user", "content": "hi"}]),
                st.lists(
                    st.fixed_dictionaries(
                        {
                            "role": st.sampled_from(["user", "system", "tool", 3]),
                            "content": st.one_of(st.text(max_size=40), _JSON),
                        }
                    ),
                    max_size=3,
                ),
                _JSON,
            )
        ),
        "max_tokens": draw(st.one_of(st.integers(-5, 40), st.integers(-(2**63), 2**63 - 1), _SCALARS)),
    }
    for name in draw(st.lists(st.sampled_from(["n", "stream", "stream_options", "temperature", "top_p", "stop",
                                               "logprobs", "priority", "seed", "tools", "user", "max_completion_tokens",
                                               "ignore_eos", "extra"]), max_size=4, unique=True)):  # fmt: skip
        body[name] = draw(st.one_of(_JSON, st.integers(-3, 5)))
    return orjson.dumps(body)


# ------------------------------------------------------------------------------------------- the run
@dataclass
class FuzzReport:
    operations: int = 0
    cases: int = 0
    bodies: int = 0
    failures: list[str] = field(default_factory=list)
    schema_source: str = ""

    def lines(self) -> list[str]:
        head = [f"schema: {self.schema_source}",
                f"schemathesis: {self.cases} cases over {self.operations} operations; hostile bodies: {self.bodies}",
                f"failures: {len(self.failures)}"]  # fmt: skip
        return head + [f"  - {f}" for f in self.failures[:50]]


@dataclass(frozen=True, slots=True)
class FuzzTarget:
    url: str
    key: str
    admin_key: str


def fuzz_target(target: FuzzTarget, *, max_examples: int, body_examples: int, seed: int | None,
                log: Callable[[str], None] = lambda _: None) -> FuzzReport:  # fmt: skip
    """Fuzz a running gateway at ``target.url``."""
    import schemathesis
    from schemathesis.core.result import Ok

    report = FuzzReport()
    with httpx.Client(base_url=target.url, timeout=30) as client:
        published = client.get("/openapi.json")
        if published.status_code == 200:
            doc, report.schema_source = published.json(), f"{target.url}/openapi.json"
        else:
            doc, report.schema_source = _generated_schema(), "gateway.app.create_app(...).openapi() (not published: D6)"
        schema = schemathesis.openapi.from_dict(with_completion_bodies(doc))
        hyp = settings(max_examples=max_examples, deadline=None, database=None, derandomize=seed is not None,
                       suppress_health_check=list(HealthCheck))  # fmt: skip
        for result in schema.get_all_operations():
            if not isinstance(result, Ok):
                report.failures.append(f"schema: an operation cannot be fuzzed: {result.err()}")
                continue
            op = result.ok()
            report.operations += 1
            log(f"fuzzing {op.label}")
            hyp(given(case=op.as_strategy())(_case_checker(op, target, report)))()

        @settings(max_examples=body_examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(body=hostile_chat_body())
        def hostile(body: bytes) -> None:
            report.bodies += 1
            headers = {"authorization": f"Bearer {target.key}", "content-type": "application/json"}
            r = client.post("/v1/chat/completions", content=body, headers=headers)
            problem = openai_error_problem(r.status_code, r.content)
            if problem is not None:
                report.failures.append(f"POST /v1/chat/completions {body[:120]!r}: {problem}")

        log("fuzzing hostile chat bodies")
        hostile()
    return report


def _case_checker(op: Any, target: FuzzTarget, report: FuzzReport) -> Callable[[Any], None]:
    """The per-case check of one operation: call it with the right key and record any problem."""
    from schemathesis.checks import not_a_server_error, response_schema_conformance

    auth = target.admin_key if op.path.startswith("/admin/") else target.key

    def check(case: Any) -> None:
        report.cases += 1
        response = case.call(base_url=target.url, headers={"authorization": f"Bearer {auth}"})
        problem = openai_error_problem(response.status_code, response.content)
        try:
            case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
        except Exception as exc:  # schemathesis raises a group of failures
            problem = problem or f"schema: {str(exc)[:300]}"
        if problem is not None:
            report.failures.append(f"{op.label}: {problem}")

    return check


def _generated_schema() -> dict[str, Any]:
    from fleet.clock import SystemClock
    from fleet.config import load_fleet, load_tenants
    from fleet.store.memory import MemoryStore
    from gateway.http.app import create_app
    from gateway.settings import GatewaySettings
    from gateway.wiring import GatewayDeps

    app = create_app(GatewayDeps(GatewaySettings(), store=MemoryStore(), clock=SystemClock(), fleet=load_fleet(),
                                 tenants=load_tenants()))  # fmt: skip
    return app.openapi()


@contextlib.contextmanager
def fuzz_stack(run_dir: Path) -> Iterator[FuzzTarget]:
    """A simulated worker and a ``gearshift gateway`` process in front of it, with fresh keys."""
    procs: list[Proc] = []
    try:
        procs.append(start_sim("fuzz-0", log_dir=run_dir, speedup=100.0))
        pepper, key, admin = (
            secrets.token_urlsafe(16),
            "gs-fuzz-" + secrets.token_urlsafe(16),
            secrets.token_urlsafe(16),
        )
        fleet = {"models": [{"name": MODEL}], "workers": [{"id": "w0", "url": procs[0].url, "model": MODEL}]}
        tenants = {
            "tiers": {"standard": {"priority": 0}},
            "tenants": [{"id": "fuzz", "tier": "standard", "rpm": 1_000_000, "tpm": 10**12,
                         "keys": [{"id": "fuzz-1", "digest": key_digest(key, pepper=pepper)}]}],
        }  # fmt: skip
        (run_dir / "fleet.yaml").write_text(yaml.safe_dump(fleet))
        (run_dir / "tenants.yaml").write_text(yaml.safe_dump(tenants))
        env = {
            "GEARSHIFT_FLEET_FILE": str(run_dir / "fleet.yaml"),
            "GEARSHIFT_TENANTS_FILE": str(run_dir / "tenants.yaml"),
            "GEARSHIFT_KEY_PEPPER": pepper,
            "GEARSHIFT_ADMIN_KEY": admin,
            "GEARSHIFT_LOG_LEVEL": "WARNING",
            "GEARSHIFT_HOST": "127.0.0.1",
            "GEARSHIFT_MAX_BODY_BYTES": str(256 * 1024),
        }
        procs.append(start_gateway("fuzz-gateway", env=env, log_dir=run_dir))
        yield FuzzTarget(url=procs[1].url, key=key, admin_key=admin)
    finally:
        for p in reversed(procs):
            p.stop()


def run_fuzz(*, max_examples: int, body_examples: int, seed: int | None,
             log: Callable[[str], None] = lambda _: None) -> FuzzReport:  # fmt: skip
    """Start a worker and a gateway, fuzz them, stop them."""
    with tempfile.TemporaryDirectory(prefix="gearshift-fuzz-") as tmp, fuzz_stack(Path(tmp)) as target:
        return fuzz_target(target, max_examples=max_examples, body_examples=body_examples, seed=seed, log=log)
