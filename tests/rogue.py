"""A registered client turned rogue, in one process: its honest reply with its tensors changed, and whatever the
server replays from a reply made to agree with the change again (BayesADMM's duals, FedDyn's λ sketch), so that
only the screen, the robust rules or the search for a culprit can stop it. Shared by the rogue tests and
benchmarks/attack_matrix.py, benchmarks/robust_aggregation.py."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import RecordDict

from fedbayes.bayes.params import unflatten
from fedbayes.protos.codec import PayloadError, encode
from fedbayes.strategies import feddyn
from fedbayes.strategies.bayesadmm import Duals, dual_step
from tests.helpers import declared_payload

# The reply's tensor group that carries the strategy's update.
UPDATE_GROUP = {
    "fedavg": "weights", "fedprox": "weights", "feddyn": "weights", "fedpa": "delta", "fedlap": "site_mean",
    "fedlap-cov": "site_mean", "p-dsvgd": "local_particles", "dsvgd": "particles", "u-dsvgd": "particles",
    "bayesadmm": "local_mean", "fedadmm": "local_mean", "bayesadmm-full": "local_mean",
}
Change = Callable[[str, str, np.ndarray], np.ndarray]  # (group, tensor name, array) -> the array the rogue sends


def consistent_reply(server, content: RecordDict, change: Change, server_round: int) -> RecordDict:
    """`content` (an honest reply to `server`'s round `server_round`) with `change` applied to every tensor, and its
    replayed parts recomputed. Content that does not decode (the client's own training diverged) is sent as is."""
    try:
        payload = declared_payload(content, server.reply_type)
    except PayloadError:
        return content
    message = payload.message
    tensors = {group: {name: change(group, name, np.array(value)) for name, value in arrays.items()}
               for group, arrays in payload.tensors.items()}
    changed = type(payload)(message, tensors)
    if hasattr(server, "duals"):  # BayesADMM: the duals are the dual step from the (changed) local posterior
        previous = server.duals.get(message.header.client_id) if message.resumed_from_round else None
        local = server._local_posterior(changed)
        start = previous or Duals(local.mean * 0, server.global_.precision * 0)
        duals = dual_step(start, local, server.global_, server.dual_step_size, server_round)
        for group, value in (("dual_mean", duals.mean), ("dual_precision", duals.precision)):
            layout = {name: array.shape for name, array in tensors[group].items()}
            if layout:
                tensors[group] = unflatten(value.numpy().ravel(), layout)
    if hasattr(server, "lambdas"):  # FedDyn: the sketch of λ_k after these weights
        lam = server._replayed_lambda(changed)
        del message.lambda_sketch[:]
        message.lambda_sketch.extend(feddyn.lambda_sketch(lam, server.settings.seed, server_round).tolist())
    return encode(message, tensors)


def scaled_update(reference: dict[str, np.ndarray], group: str, factor: float) -> Change:
    """A `Change`: group `group`'s tensors moved to reference + factor x (tensor − reference)."""
    def change(tensor_group: str, name: str, array: np.ndarray) -> np.ndarray:
        if tensor_group != group:
            return array
        return (reference[name] + factor * (array.astype(np.float64) - reference[name])).astype(np.float32)
    return change


def filled(group: str, value: float) -> Change:
    """A `Change`: group `group`'s tensors all `value`."""
    return lambda tensor_group, name, array: np.full_like(array, value) if tensor_group == group else array


def sent_reference(server, layout, client: str) -> dict[str, np.ndarray]:
    """What `client`'s update is measured from, by tensor name: the global model the server sent (w_g, m̄, the
    particles), the client's last local particles (P-DSVGD), zeros for FedPA's deltas and FedLap's site means."""
    if hasattr(server, "particles"):
        particles = server.local_particles[client] if server.parallel else server.particles
        return {"particles": particles.astype(np.float64)}
    if hasattr(server, "global_weights"):  # FedAvg, FedProx
        flat = server.global_weights
    elif hasattr(server, "duals"):  # BayesADMM
        flat = server.global_.mean.numpy()
    elif hasattr(server, "lambdas"):  # FedDyn
        flat = server.global_.numpy()
    else:  # FedPA, FedLap
        flat = np.zeros(sum(int(np.prod(shape)) for shape in layout.values()))
    return unflatten(np.asarray(flat, np.float64), layout, dtype=np.float64)

