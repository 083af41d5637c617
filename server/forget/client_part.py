"""The check of a client's part of its own forget (a strategy's ClientForget): its node's answer, checked as a round's
reply is (the round core's `checked_lone_reply`) and against what only a forget's reply must meet."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Message

from fedbayes.bayes.robust import norms, screen_bounds
from fedbayes.protos.codec import Payload, PayloadError
from fedbayes.server.forget.interface import BetweenRounds
from fedbayes.strategies.base import ClientForget, ForgetRefused


def checked_forget_reply(
    core: BetweenRounds, reply: Message, client: str, asked: ClientForget[Any], server_round: int
) -> Payload[Any]:
    """`client`'s reply to `asked` (its part of its forget).

    Args:
        core: the round core whose message the reply answers.
        reply: the node's answer.
        client: the client id being forgotten.
        asked: what the strategy asked of the client.
        server_round: the round the forget follows.

    Returns:
        The reply, checked as a round's reply is (size, wire schema, round, federation, the nonce of this request,
        the id and the node it is bound to, the strategy's checks), and also: it worked from the state of the
        client's last accepted round (resumed_from_round), and its update passes the screen a lone reply meets
        (screen-ratio x the larger of the state's norm and an RMS change of 1).

    Raises:
        ForgetRefused: saying why it was refused.
    """
    label = core.reply_label(reply)
    try:
        payload = core.checked_lone_reply(reply, client, asked.reply_type, asked.reply_layouts, server_round)
        _check_forget_basis(payload, client, core.last_accepted().get(client, 0))
        _screen_alone(core, payload)
    except Exception as error:  # the guard: no reply may stop the server
        reason = str(error) if isinstance(error, PayloadError) else f"{type(error).__name__}: {error}"
        raise ForgetRefused(f"the forget reply of {label} was refused: {reason.removeprefix(f'{label}: ')}") from None
    return payload


def _check_forget_basis(payload: Payload[Any], client: str, accepted: int) -> None:
    resumed = payload.reply.resumed_from_round
    if resumed != accepted:
        raise PayloadError(
            f"field 'resumed_from_round': {resumed}, but the factor the server's state holds of client {client!r} "
            f"is of round {accepted}"
        )


def _screen_alone(core: BetweenRounds, payload: Payload[Any]) -> None:
    update = core.strategy.update_of(payload)
    if update is None:
        return
    (norm,) = norms([update])
    ratio = core.settings.trust.screen_ratio
    # alone, an update has no others to be compared with for its size (a forget's reply claims no examples)
    (bound,) = screen_bounds(np.array([norm]), np.ones(1), core.strategy.state_norm(), update.size, ratio)
    if norm > bound:
        raise PayloadError(
            f"refused by the screen: its update's norm {norm:.3g} is over {bound:.3g} (screen-ratio="
            f"{ratio:g} x the larger of the state's norm and an RMS change of 1)"
        )
