"""Forgetting a client: take one client's contribution out of a federation's server state, revoke its id,
and record it, on a stopped federation or between the rounds of a running one.

Who asks. The operator, with `fedbayes forget RUN --client ID` (deploy/cli.py), or the client itself, with
`fedbayes client --leave --forget`, whose ClientApp answers every instruction with a LeaveAndForget message instead of
training (protos/payloads.proto); a client's request is honoured only from the node its id is bound to
(server/identity.py `bound_node`). The server tells the node a forgotten client was bound to, in every later
instruction to it (Header.forgotten_client_id); a leaving client then deletes its durable state and leaves.

The request path. An operator's request is a JSON file in <server-state-dir>/<federation>/forget-requests/. A running
server holds <server-state-dir>/<federation>/server.lock (flock: the kernel frees it when the process exits, however
it exits; server/loop.py run_rounds) and settles the requests, the operators' and its clients', after a round is
committed and checkpointed and before the next one is configured: never mid-round, so a request made while a round
is in flight waits for its end. When no server holds the lock, `fedbayes forget` takes it and settles them itself on
the newest checkpoint, the strategy's server half rebuilt from the checkpoint's run config (`settle_stopped`).

Applying a forget: the strategy's `forget(client)` (strategies/base.py: the state without the client, computed from
what the server holds, changing nothing), written to the checkpoint together with the client's id unbound, its
accepted round dropped, its id revoked and the forget's record in the ledger (server/identity.py ForgetLedger);
the global arrays become `Forgotten.weights` plus the model's buffers. Then, in this order: the checkpoint of the same
round is rewritten (atomically: temp file, fsync, rename), the older checkpoints, which still hold the client, are
deleted, the record is appended to the audit log (forget-audit.jsonl next to the checkpoints), the request file is
deleted, and only then does the round core (a running server's) adopt the committed state (server/round_core.py Change).

Atomicity. The checkpoint is the truth. A crash leaves the old or the new checkpoint, never a mix; whatever the ledger
of the newest checkpoint records that the audit log lacks (a crash between the two) is appended, and the checkpoints
older than the last forget are deleted, the next time requests are settled or the server starts. So the audit log
never records a forget the checkpoint does not hold. An operator's request file stays until its outcome is in the
audit log; a client asks again every round until it is confirmed.

Refused, with a reason in the audit log and nothing else changed: a request for another federation, an id that is
not a client id, an id already forgotten (readmit it first), a readmission of an id that is not revoked, a client's
request from another node than its own, and whatever the strategy refuses (ForgetRefused: an unknown id, the last
remaining client, strategies that cannot: FedAvg, FedProx and FedPA keep no per-client factor), and, for a strategy
whose factor lives on the client (DSVGD, U-DSVGD: `forget` returns a ClientForget), a federation that is stopped or a
client that is not connected, and a client's part that is missing or fails the checks any reply meets.

The client's part (ClientForget). The server cannot compute such a forget alone: a running server asks the node the
client id is bound to, between rounds, in a one-message exchange of its own (ClientLink, built by server/loop.py on its
grid, bounded by round-timeout), checks the answer as a round's reply (client_part.py checked_forget_reply), and
commits it as any forget; then it tells the node at once that its client is forgotten. See settling.py
Forgetting._with_client_part for why it happens there and not inside a round.

Refinement. `refine_rounds` R, at most MAX_REFINE_ROUNDS (tasks/config.py): the federation runs at least R ordinary
rounds among the remaining clients after the round t the forget was applied after. The rounds a running federation
has left count; a federation resumed before round t + R runs through round t + R whatever its num-server-rounds says
(run_rounds raises it and logs so).

The package, by role: requests.py (who asks, the operators' queue), audit.py (the audit log), lock.py (the server
lock), settling.py (deciding and committing requests against a round core), interface.py (BetweenRounds: what
settling asks of the round core), client_part.py (the check of a client's part), stopped.py (a stopped federation's
server, rebuilt: server/assembly.py), command.py (`fedbayes forget`).
"""

from __future__ import annotations

from fedbayes.server.forget.audit import AUDIT_LOG, AuditLog
from fedbayes.server.forget.command import audit_path, describe_outcome, forget_command
from fedbayes.server.forget.lock import LOCK_FILE, server_lock
from fedbayes.server.forget.requests import REQUESTS_DIRECTORY, ForgetError, ForgetRequest, RequestQueue
from fedbayes.server.forget.settling import ClientLink, Forgetting
from fedbayes.server.forget.stopped import Rebuilt, rebuild, settle_stopped

__all__ = [
    "AUDIT_LOG",
    "LOCK_FILE",
    "REQUESTS_DIRECTORY",
    "AuditLog",
    "ClientLink",
    "ForgetError",
    "ForgetRequest",
    "Forgetting",
    "Rebuilt",
    "RequestQueue",
    "audit_path",
    "describe_outcome",
    "forget_command",
    "rebuild",
    "server_lock",
    "settle_stopped",
]
