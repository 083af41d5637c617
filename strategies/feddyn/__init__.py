"""FedDyn (Acar et al., 2021) in the official code's form (docs/algorithms/feddyn.md).

  client k:  w_k ← argmin_w  L_k(w) + (α_k/2)‖w − (w_g − λ_k)‖² + (wd/2)‖w‖²,   α_k = α·N/(K·N_k)
             λ_k ← λ_k + (w_k − w_g)                                         ("local_param_list += curr − cld")
  server:    w_g ← mean_{k replied} w_k + (1/K) Σ_{all k} λ_k
L_k is the mean minibatch loss; wd is the run's `weight-decay` (Adam's coupled weight decay, = the explicit
term). Eq. 2 of [P] with v_k = α_k λ_k is the same algorithm (§2.3). Fixed point: argmin Σ_k ℓ_k + (N·wd/2)‖w‖²
(§2.3), with wd = 0 the unregularised optimum. Each client uses its own α_k (the reference code overwrote every
client's α with the last client's; we do not).

Where the state lives: λ_k in the client's durable store (client/state.py), so it survives a SuperNode restart.
The server keeps its own replay of every λ_k (λ_k += w_k − w_g from the w_k it receives), so it knows
Λ = Σ_k λ_k without the clients sending λ_k; the uplink is w_k plus a sketch R·λ_k of SKETCH_ROWS numbers (R a
±1 matrix drawn from the round's seed), which the server compares with R applied to its replay: a client whose
λ_k has drifted from the server's (an edited or foreign state) is refused, not trusted.

Robust aggregation (run config `robust-aggregation`): w_g ← w_g + R_k(w_k − w_g) + R_k(λ_k), with R the clip,
median or trimmed-mean of bayes/robust.py over this round's replies and over every known λ_k; `none` is the
plain means above.

Membership (strategies/membership.py): K and N count the clients the server has heard from. Partial
participation (`fraction-train` < 1): the mean runs over this round's repliers, Λ over every known client's λ_k,
as in FedDyn's Alg. 1. In round 1 the server knows no sizes, so every client uses α_k = α. A client joining
mid-run starts at λ_k = 0 and the current w_g, and counts itself into K and N for its α_k; from its first reply
on it is in the server's K and N, which moves every α_k a little (the fixed point only depends on the final
α_k). A client that lost its state (it reports resumed_from_round 0 but the server knows it) starts again from
λ_k = 0; the server resets its replay of that λ_k too, so Λ stays the sum of the clients' actual λ_k.

Forgetting a client (`forget`, docs/guides/forgetting.md): λ_k is a gradient correction, not a probabilistic factor,
and the server does not store the clients' last models. At the fixed point every w_j = w_g, Σ_j λ_j = 0 and
α_j λ_j = −(∇L_j(w*) + wd·w*); a remaining client whose w_g and λ_j did not change replies w_g, so the first server
step without k needs no client work: w_g' = w_g + Σ_{j≠k} λ_j/(K−1) = w_g − λ_k/(K−1) (`server_step_without`). As
N_j α_j = αN/K, that is one gradient step of size K/((K−1)αN) from w* on the remaining objective
Σ_{j≠k} ℓ_j + (N'·wd/2)‖w‖² (N' = N − N_k): an estimate, not the model trained without k. The remaining λ_j stay (the
clients hold them; the server's replay must match; restarted from zero they leave twice as much of k in after
three rounds, docs/guides/forgetting.md) and K, N stop counting k, which moves every α_j a little; refinement
rounds among the remaining clients are the honest route to the model without k.
"""
