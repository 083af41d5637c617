"""`fedbayes client --leave --forget` waits for the server with a limit (deploy/client.py Leaving): it says what it
waits for and each request its ClientApp sent (the notes client/app.py leaves in the state directory), leaves once the
server has confirmed, and past --leave-timeout gives up saying whether no instruction came or the request was not
confirmed."""

from __future__ import annotations

import json

import pytest

from fedbayes.client.state import leave_request_note, left_marker
from fedbayes.deploy.client import Leaving


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def leaving(tmp_path, timeout: float = 60.0) -> tuple[Leaving, Clock]:
    clock = Clock()
    return Leaving(tmp_path, "hospital-d", timeout, clock), clock


def test_it_says_what_it_waits_for_and_its_limit(tmp_path):
    assert "up to 60 s (--leave-timeout)" in leaving(tmp_path)[0].waits_for()
    assert "no limit" in leaving(tmp_path, timeout=0)[0].waits_for()


def test_no_instruction_within_the_limit_gives_up_saying_nothing_came(tmp_path):
    waiting, clock = leaving(tmp_path)
    clock.now += 59
    assert waiting.done() is False
    clock.now += 2
    with pytest.raises(TimeoutError, match="gave up after 60 s") as gave_up:
        waiting.done()
    assert "no instruction came from the server" in str(gave_up.value)
    assert "state is kept" in str(gave_up.value)


def test_a_request_sent_but_not_confirmed_is_named_when_it_gives_up(tmp_path, capsys):
    waiting, clock = leaving(tmp_path)
    leave_request_note(tmp_path, "hospital-d").write_text(json.dumps({"federation": "prod", "round": 7}))
    assert waiting.done() is False
    assert "asked the server to forget this client (federation 'prod', round 7)" in capsys.readouterr().err
    assert waiting.done() is False
    assert capsys.readouterr().err == ""  # each request is said once
    clock.now += 61
    with pytest.raises(TimeoutError) as gave_up:
        waiting.done()
    assert "asked the server to forget it (federation 'prod', round 7)" in str(gave_up.value)
    assert "no instruction since has confirmed it" in str(gave_up.value)


def test_the_confirmation_ends_the_wait_and_its_notes(tmp_path, capsys):
    waiting, _ = leaving(tmp_path)
    leave_request_note(tmp_path, "hospital-d").write_text(json.dumps({"federation": "prod", "round": 7}))
    left_marker(tmp_path, "hospital-d").write_text(json.dumps({"federation": "prod", "round": 8}))
    assert waiting.done() is True
    assert "the server has forgotten this client" in capsys.readouterr().err
    assert not left_marker(tmp_path, "hospital-d").exists() and not leave_request_note(tmp_path, "hospital-d").exists()


def test_no_limit_waits_on(tmp_path):
    waiting, clock = leaving(tmp_path, timeout=0)
    clock.now += 10**9
    assert waiting.done() is False


def test_an_earlier_attempts_request_is_not_taken_for_this_ones(tmp_path):
    note = leave_request_note(tmp_path, "hospital-d")
    note.write_text(json.dumps({"federation": "prod", "round": 3}))
    waiting, clock = leaving(tmp_path)
    assert not note.exists()
    clock.now += 61
    with pytest.raises(TimeoutError, match="no instruction came"):
        waiting.done()
