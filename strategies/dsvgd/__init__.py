"""DSVGD (Kassab & Simeone, "Federated Generalized Bayesian Learning via Distributed Stein Variational
Gradient Descent"), and its parallel variant P-DSVGD (App. A.5, Alg. 5). Spec: docs/algorithms/dsvgd.md.

The server holds N global particles Θ (N x P, all model parameters of each particle); their KDE is the
global posterior q. Each round it schedules ONE client (round-robin over stable client ids by default)
and sends it Θ^(i-1). The client
  loop 1 (eqs. 13-14): runs L SVGD steps from Θ^(i-1) towards its tilted distribution
                       p̃_k ∝ q^(i-1)/t_k^(i-1) · exp(-L_k/α) and sends the result Θ^(i) back;
  loop 2 (eq. 17):     distils its factor t_k^(i) ∝ t_k^(i-1) · q^(i)/q^(i-1) into its N local particles
                       Θ_k, which stay in its durable store (client/state.py) and never leave it.
The server replaces Θ by the upload; it never averages particles (they are exchangeable).

Where the prior enters: convention B of the spec (§3.4, the authors' code). A client's local particles
start as copies of Θ^(0) and loop 1 adds ∇log p_0, so the local factor approximates p_0·exp(-L_k/α), a
proper density, and every SVGD target stays normalisable. Θ^(0) is drawn from the model's own
initialiser (torch's default for Linear layers) with the run's seed; client and server draw the same.
L_k is the client's summed loss, estimated on one minibatch per step (the same for all particles) x |D_k|/B.

Rounds whose scheduled client fails leave Θ unchanged. The server tells each client the round of its last
accepted update, and the client starts from the local particles it stored in that round: particles
distilled for an update the server never received are not used.

Scheduling: the server learns a node's stable client id from its first reply, so a node it has not yet sent work
to (a new client, or one whose SuperNode restarted) is scheduled first; after that clients take turns in
client-id order, and a node that was sent work but never got a reply accepted takes its turn after them (it may
not claim every round: that starved the others). A quarantined node is skipped (server/isolation.py);
`dsvgd-scheduler = "random"` draws one eligible node per round instead.

P-DSVGD (`p-dsvgd`): a `fraction-train` of the clients per round run both loops from the server's φ and upload
their local particles; the server keeps every client's latest set and distils φ towards
q = p_0 Π_k t_k (eq. 28-29), with t_k = KDE(Θ_k)/p_0 under convention B.

U-DSVGD (`u-dsvgd`, Sec. 5.1, Alg. 4): DSVGD without distillation. The scheduled agent keeps, for every round j
it was scheduled in, the global particles it downloaded (Θ^(j-1)) and uploaded (Θ^(j)), and its factor is the
product t_k = Π_j q^(j)/q^(j-1) over those visits (eq. 10), with q^(0) = p_0 (analytic) and every other q^(j) the
KDE of Θ^(j); loop 1 is DSVGD's with that t_k. Its memory grows by 2·N·P float32 per visit (28.5 MB for 20
particles of the 784-200-100-10 MLP), and each SVGD step costs one KDE per buffered set: a client refuses to
go past `udsvgd-max-visits` visits (run config), naming the key. With K = 1 it is SVGD (A.6).

Evaluation: the server's predictive averages the N particles (eq. 27) and is reported under the
`*_ensemble` keys; the plain keys evaluate the particle mean, which for a network is no meaningful model.

Forgetting a client (`forget`, docs/guides/forgetting.md; Forget-SVGD: Gong, Simeone, Kassab & Kang, arXiv 2111.12056,
built on this paper's tilted update, eqs. 13-14): q ≈ p_0 Π_k t_k, and forgetting agent k is SVGD from the current
particles towards q/t_k = p_0 Π_{j≠k} t_j. Where t_k lives decides who can run it:
  p-dsvgd   the server keeps every client's latest local particles (t_k = KDE(Θ_k)/p_0, convention B), so it runs its
            own distillation (eqs. 28-29) without Θ_k: `server-steps` SVGD steps of φ towards p_0 Π_{j≠k} t_j. A
            particle estimate (KDE factors of width λ, N particles), not exact; refinement rounds go on from the
            remaining sets.
  dsvgd     t_k lives only in client k's durable store (its local particles; U-DSVGD: the particles of its visits) and
  u-dsvgd   the server holds Θ alone: it cannot divide t_k out. In Forget-SVGD client k takes part: `forget` returns a
            ClientForget (strategies/base.py), and between rounds the server sends client k a DSVGDForgetInstruction
            with Θ; the client runs L SVGD steps from Θ towards q/t_k from its store alone (math.py `forget_update`,
            `unconstrained_forget_update`: `tilted_update` and `unconstrained_tilted_update` with the loss left out, so
            no data is needed and a leaving client can answer) and uploads Θ' in a DSVGDForgetReply; the server checks
            it as any reply and adopts it as Θ, as it adopts a round's upload. A particle estimate: the KDE factors
            widen each t_k by λ². The other clients' factors stay as they are; refinement rounds go on from Θ'. The
            client must be connected to a running server (server/forget/): a stopped federation refuses.
"""
