"""The request hints (``gateway.intake.hints``): one pass over the headers, each hint checked by its stage."""

from __future__ import annotations

import pytest

from fleet.config import SpeculationMode, TenantConfig, TierConfig
from gateway.errors import HeaderNotAllowed, InvalidRequest
from gateway.intake.auth import Principal
from gateway.intake.hints import RequestHints


def _principal(*, workload: str | None = None, allowed: tuple[SpeculationMode, ...] = ()) -> Principal:
    tenant = TenantConfig(id="t", tier="interactive", workload=workload, speculation_header=allowed)
    return Principal(tenant=tenant, tier_name="interactive", tier=TierConfig(), key_id="k")


def test_no_hint_headers_give_the_tenant_and_tier_defaults() -> None:
    hints = RequestHints.read([(b"authorization", b"Bearer x")], _principal(workload="maths"))
    assert hints == RequestHints(workload="maths", session=None, speculation=TierConfig().speculation)


def test_each_hint_is_read_and_the_first_of_a_repeated_header_counts() -> None:
    headers = [
        (b"x-gearshift-workload", b"code"),
        (b"x-gearshift-session", b"conv-1"),
        (b"x-gearshift-speculation", b"OFF"),
        (b"x-gearshift-workload", b"chat"),
    ]
    hints = RequestHints.read(headers, _principal(allowed=(SpeculationMode.OFF,)))
    assert (hints.workload, hints.session, hints.speculation) == ("code", "conv-1", SpeculationMode.OFF)


@pytest.mark.parametrize(
    ("header", "value", "error"),
    [
        (b"x-gearshift-workload", b"no spaces", InvalidRequest),
        (b"x-gearshift-session", b"", InvalidRequest),
        (b"x-gearshift-speculation", b"off", HeaderNotAllowed),
    ],
)
def test_a_bad_hint_is_refused_naming_its_header(header: bytes, value: bytes, error: type[Exception]) -> None:
    with pytest.raises(error) as raised:
        RequestHints.read([(header, value)], _principal())
    assert getattr(raised.value, "param", None) == header.decode()
