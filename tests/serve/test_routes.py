"""Each route module on its own: mounted on a bare FastAPI app (with the app's error handlers)
from one `RouteContext`, over a backend written here; no `create_app`, no server (the composed
app is tests/serve/test_app.py)."""

from __future__ import annotations

import math

from fastapi import FastAPI
from fastapi.testclient import TestClient

from rewardplane.serve.app import install_error_handlers
from rewardplane.serve.config import Limits
from rewardplane.serve.metrics import ServeMetrics
from rewardplane.serve.protocol import ItemError, ScoreItem, ScorerInfo
from rewardplane.serve.routes import RouteContext, route_paths, service_routers
from rewardplane.serve.routes.health import health_router
from rewardplane.serve.routes.lifecycle import lifecycle_router
from rewardplane.serve.routes.score import score_router


class Backend:
    """Scores len(response); "NAN" scores NaN, "BAD" is an item error. `loaded` names the
    scorers whose load finished; `actions` records lifecycle calls."""

    def __init__(self, names=("n",), loaded=("n",)) -> None:
        self.names, self.loaded = list(names), set(loaded)
        self.actions: list[tuple] = []

    def scorer_names(self) -> list[str]:
        return self.names

    def scorer_infos(self) -> dict[str, ScorerInfo]:
        return {n: ScorerInfo(n, "len", "text", "-", "cpu", "1", f"id-{n}", 8, 1.0) for n in self.loaded}

    def ready(self):
        return self.loaded == set(self.names), {
            n: "ready" if n in self.loaded else "loading" for n in self.names
        }

    async def score(self, name: str, items: list[ScoreItem]) -> list:
        out = []
        for item in items:
            if item.response == "NAN":
                out.append(math.nan)
            elif item.response == "BAD":
                out.append(ItemError("bad_input", "bad"))
            else:
                out.append(float(len(item.response)))
        return out

    async def lifecycle_action(self, action, names, timeout_s):
        self.actions.append((action, names, timeout_s))
        return {n: {"action": action, "changed": True, "state": "offloaded"} for n in names or self.names}

    async def lifecycle_state(self):
        return {"scorers": {}, "processes": {}}


def client(router_of, backend) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)  # a ServeError raised in a handler becomes its JSON answer
    app.include_router(router_of(RouteContext(backend, Limits(max_items=4), ServeMetrics())))
    return TestClient(app)


def test_the_score_route_alone_checks_the_request_and_every_value():
    http = client(score_router, Backend())
    items = [{"id": "a", "response": "xyz"}, {"id": "b", "response": "NAN"}, {"id": "c", "response": "BAD"}]
    r = http.post("/v1/score", json={"scorers": ["n"], "items": items})
    assert r.status_code == 200 and float(r.headers["x-total-time"]) >= 0
    results = r.json()["results"]
    assert results[0]["scores"] == {"n": 3.0}
    assert results[1]["errors"]["n"]["code"] == "non_finite"  # the route's own check, not the backend's
    assert results[2]["errors"]["n"] == {"code": "bad_input", "message": "bad", "kind": "item"}
    pinned = http.post("/v1/score", json={"scorers": ["n"], "items": items[:1], "pin": {"n": "other"}})
    assert pinned.status_code == 409 and pinned.json()["code"] == "identity_mismatch"
    many = http.post("/v1/score", json={"scorers": ["n"], "items": [{"id": str(k)} for k in range(5)]})
    assert many.status_code == 413 and many.json()["code"] == "too_many_items"


def test_the_health_route_alone_says_which_scorer_is_loading():
    http = client(health_router, Backend(names=("n", "m"), loaded=("n",)))
    assert http.get("/health/live").json() == {"status": "ok"}
    ready = http.get("/health/ready")
    assert ready.status_code == 503 and ready.json()["scorers"] == {"n": "ready", "m": "loading"}


def test_the_lifecycle_route_alone_reads_scorers_from_the_query_or_the_body_not_both():
    backend = Backend()
    http = client(lifecycle_router, backend)
    assert http.post("/v1/lifecycle/offload?scorer=n&timeout_s=2").json()["action"] == "offload"
    assert http.post("/v1/lifecycle/drain", json={"scorers": ["n"]}).status_code == 200
    assert backend.actions == [("offload", ["n"], 2.0), ("drain", ["n"], None)]
    both = http.post("/v1/lifecycle/onload?scorer=n", json={"scorers": ["n"]})
    assert both.status_code == 422 and both.json()["code"] == "invalid_request"
    nan = http.post("/v1/lifecycle/offload", content=b'{"timeout_s": NaN}')
    assert nan.status_code == 422 and nan.json()["code"] == "invalid_request"
    assert len(backend.actions) == 2


def test_the_service_answers_lifecycle_and_deployment_routes_only_for_backends_that_have_them():
    ctx = RouteContext(Backend(), Limits(), ServeMetrics())
    paths = route_paths(service_routers(ctx))
    assert {"/v1/score", "/v1/scorers", "/health/ready", "/metrics", "/get_reward", "/score"} <= paths
    assert "/v1/lifecycle" in paths and "/v1/deployment" not in paths

    class NoLifecycle:
        def __init__(self) -> None:
            self.inner = Backend()

        def __getattr__(self, name):
            if name.startswith("lifecycle"):
                raise AttributeError(name)
            return getattr(self.inner, name)

    bare = route_paths(service_routers(RouteContext(NoLifecycle(), Limits(), ServeMetrics())))
    assert "/v1/lifecycle" not in bare and "/v1/score" in bare
