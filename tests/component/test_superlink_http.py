"""`fedbayes superlink`'s Control API middlewares pass a Runtime API request straight on (deploy/superlink.py
`passing_runtime_requests_through`), on Flower's own SuperLink app: the same requests get the same answers, the Control
API's layers still act on the Control API (no-cache headers on a sensitive route, authentication), and a Runtime API
request reaches none of their `dispatch`es."""

from __future__ import annotations

import flwr
import pytest
from fastapi.testclient import TestClient
from flwr.proto.message_pb2 import PullObjectRequest
from flwr.superlink.main import create_app
from flwr.superlink.routers.control import middlewares

from fedbayes.flowerseam.superlink import passing_runtime_requests_through

CONTROL_LAYERS = (
    "ControlSensitiveResponseMiddleware",
    "ControlAuthenticationMiddleware",
    "ControlLicenseMiddleware",
    "ControlEventLogMiddleware",
)
PROTOBUF = {"Content-Type": "application/protobuf"}
RUNTIME = ("/v1/runtime/pull-object", PullObjectRequest(run_id=1, object_id="0" * 64).SerializeToString())
SENSITIVE = ("/v1/control/get-login-details", b"")
AUTHENTICATED = ("/v1/control/list-runs", b"")


@pytest.fixture
def dispatched(monkeypatch) -> list[str]:
    """The Control layers whose `dispatch` ran, in order; what the patch changes is put back after the test."""
    calls: list[str] = []
    for name in CONTROL_LAYERS:
        layer = getattr(middlewares, name)
        monkeypatch.setattr(layer, "__call__", layer.__call__)

        def counted(self, request, call_next, dispatch=layer.dispatch, name=name):
            calls.append(name)
            return dispatch(self, request, call_next)

        monkeypatch.setattr(layer, "dispatch", counted)
    return calls


def answers(requests: list[tuple[str, bytes]], dispatched: list[str]) -> list[tuple[int, dict[str, str], bytes, list]]:
    """Status, the headers that matter, body, and the Control layers dispatched, per request, on a new app."""
    out = []
    with TestClient(create_app()) as client:
        for path, body in requests:
            dispatched.clear()
            response = client.post(path, content=body, headers={**PROTOBUF, "Authorization": "Bearer not-a-token"})
            headers = {name: response.headers.get(name, "") for name in ("cache-control", "pragma", "content-type")}
            out.append((response.status_code, headers, response.content, list(dispatched)))
    return out


def test_runtime_requests_skip_the_control_layers_and_get_flowers_answers(dispatched):
    requests = [RUNTIME, SENSITIVE, AUTHENTICATED]
    flowers = answers(requests, dispatched)
    passing_runtime_requests_through()
    ours = answers(requests, dispatched)

    assert [answer[:2] for answer in ours] == [answer[:2] for answer in flowers]
    assert [answer[2] for answer in ours[:2]] == [answer[2] for answer in flowers[:2]]  # list-runs: a timestamp
    (runtime, sensitive, authenticated) = ours
    assert runtime[0] == 401 and flowers[0][3] == list(CONTROL_LAYERS), "Flower's: every Control layer dispatched"
    assert runtime[3] == [], "the Runtime API request passed every Control layer by"
    assert sensitive[1]["cache-control"] == "no-store" and "ControlSensitiveResponseMiddleware" in sensitive[3]
    assert "ControlAuthenticationMiddleware" in authenticated[3] and authenticated[0] == 200


def test_another_flower_is_refused_not_patched(monkeypatch, dispatched):
    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    with pytest.raises(SystemExit, match="patches Flower 1.39.0's Control API middlewares, but Flower 1.40.0 is"):
        passing_runtime_requests_through()
    assert answers([RUNTIME], dispatched)[0][3] == list(CONTROL_LAYERS)
