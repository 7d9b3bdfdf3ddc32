"""Property-based API tests from the service's own OpenAPI document (issue 44): schemathesis
generates requests for every route of a real server (rule scorers: cheap), sends them with the
token, and checks that no answer is a 5xx and that every answer conforms to the document's
schema for it (status codes, content types, bodies). Bounded: a few examples per route."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from support.serve import LiveServer, make_config  # noqa: E402

TOKEN = "schemathesis-token"
EXAMPLES_PER_ROUTE = 8
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
LIFECYCLE_LAST = ("/drain", "/offload", "/onload", "/lifecycle")
"""Routes that change the service's state run after the others, so a drained service does not
answer the rest with its (documented) 503."""


def _config():
    return make_config(
        [
            {"name": "len", "kind": "length"},
            {"name": "em", "kind": "exact_match"},
            {"name": "fmt", "kind": "regex", "options": {"pattern": r"\\boxed\{"}},
        ],
        token=TOKEN,
    )


def _order(operation) -> tuple[bool, str]:
    path = operation.path
    return any(part in path for part in LIFECYCLE_LAST), f"{path} {operation.method}"


def test_every_route_answers_without_5xx_and_as_its_schema_says():
    with LiveServer(_config()) as server:
        schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
        operations = sorted((r.ok() for r in schema.get_all_operations()), key=_order)
        assert len(operations) >= 8, [o.label for o in operations]
        failures = []
        for operation in operations:

            @settings(
                max_examples=EXAMPLES_PER_ROUTE,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy())
            def check(case) -> None:
                case.call_and_validate(
                    base_url=server.url,
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    checks=CHECKS,
                    timeout=30,
                )

            try:
                check()
            except (Exception, BaseExceptionGroup) as exc:  # every route is tried; all reported at once
                lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
                failures.append(f"{operation.label}: {' | '.join(lines[:8])[:400]}")
        assert not failures, "\n".join(failures)
