"""BayesADMM (Möllenhoff et al., "Federated ADMM from Bayesian Duality"), and federated ADMM as its
isotropic special case.

The server holds q̄ = N(m̄, S̄^-1); client k holds q_k = N(m_k, S_k^-1) and duals (v_k, U_k) on the
natural parameters. One round:
  client (line 4):    q_k <- argmin E_q[loss_k/τ + v_k·θ - ½ θ·U_k θ] + ρ KL(q ‖ q̄)      (Eq. 28, 40)
  client (lines 5-6): v_k <- v_k + γ (S_k m_k - S̄ m̄),  U_k <- U_k + γ (S_k - S̄)            (Eq. 36)
  server (lines 9-11): S̄ <- (1-α) Mean(S_k) + α [δ I + Sum(U_k)]                            (Eq. 37)
                       m̄ <- S̄^-1 [(1-α) Mean(S_k m_k) + α Sum(v_k)],  α = 1/(1 + ρK)        (Eq. 38)
Sign convention: the paper's (duals add client - server; the server adds the dual sums).

Families (the precision's shape, see bayes/gaussian.py):
  diagonal  Alg. 1; the client solves line 4 with IVON (bayes/ivon.py), ess = N_k/(ρτ) (App. D).
  isotropic fixed unit covariance + the delta approximation = federated ADMM (Fig. 2a, Eqs. 21-25):
            the client minimises loss_k + v_k·θ + ρ/2 ‖θ - m̄‖² with Adam/SGD, U_k stays 0, S̄ stays 1.
  full      App. C.4, for small logistic regressions (strategy `bayesadmm-full`): the client takes
            `local-epochs` VON/Newton steps of size `lr` on Eq. 34 (`newton_client_step`, delta
            approximation; exact in one unit step for a quadratic loss, Prop. 3.2). Precisions and U_k
            travel as one P x P matrix, so P is capped at MAX_FULL_PARAMETERS.

Membership (a real federation, not the paper's fixed K): Mean(...) runs over the clients that replied
this round; Sum(...) over the stored duals of every client that ever replied; K = that number, so α
changes when a client joins. A joining client starts with v = U = 0 at the current q̄. Duals live on
the client, in its durable store, with IVON's state; the client reports them (Alg. 1 line 8) and the
server keeps them keyed by the stable client id, checking each report against its own replay of the
dual step, entry by entry (`replay_tolerance`). A client that lost its state restarts from zero duals: the server
logs the disagreement and uses what the client reports, so the server's sums always match the clients' objectives.

Bounded influence (run config `robust-aggregation = "clip"`): in the server step, every client's duals (v_k, U_k)
are tempered to at most `clip-ratio` x the median norm of the known clients' duals, and every local posterior's
natural parameters are moved towards q̄'s to at most `clip-ratio` x the median distance of the round's
(bayes/robust.py part_clip_factors). The server keeps (and the clients hold) the untempered duals. The screen measures
a reply's update as the change it alone would make to q̄, in mean and log precision (`reply_effect`: q̄'s natural
parameters moved 1 − α of the way to the local posterior's), not in natural parameters: honest local precisions span
many orders of magnitude (a small client's CNN: 1e2 to 1e18), which a norm in natural parameters would mistake for an
attack; and not as m_k − m̄ alone, which counts a mean far away where the local posterior is far wider than q̄ at face
value. Its expected size is the client's examples.

Forgetting a client (`forget`, docs/guides/forgetting.md): q̄ without client k from the server's state alone, by one of
three estimates. The remaining duals, shares and local posteriors stay either way, so ordinary rounds among the
remaining clients refine the result to the fixed point without k; K - 1 (and α) follow, counted from the duals held.
  share        (diagonal and full families; tried first) q̄ less k's share of it. With R of the K known clients
               replying, Eqs. 37-38 read S̄ m̄ <- (1-α) S̄ m̄ + α [prior's + Σ_k a_k], a_k = v_k + [k replied]
               (ρK/R)(S_k m_k - S̄ m̄) (likewise S̄): linear in each client's term. The server keeps each client's
               share c_k <- (1-α) c_k + α a_k from round 1 (`shares_step`), so q̄ = Π(1-α) q̄_0 + the prior's part +
               Σ_k c_k at every round, and q̄ - c_k takes out all that k's duals and local posteriors ever added,
               not only what the last step did. At the fixed point c_k is k's site (its duals): for the full
               family and a quadratic loss the posterior without k; before it, its terms are its site plus γ's part
               (all but exact on the linear-Gaussian test 10 rounds in). An estimate for cross-entropy, and in every
               case the remaining clients were fitted against a q̄ that held k. Diagonal: IVON's local precisions
               fall below q̄'s in places, so where less than δ would remain, q̄ keeps its own entry (on the FMNIST
               MLP 0.5% of the parameters). The isotropic family resets its precision after each step, and keeps
               no shares.
  fixed point  Eq. 36 stands still only where every S_k = S̄ and S_k m_k = S̄ m̄, and there Eqs. 37-38 read
               S̄ = δI + Σ_k U_k, S̄ m̄ = Σ_k v_k (`fixed_point_natural`): the duals are the clients' sites, and
               S̄' = δI + Σ_{j≠k} U_j, m̄' = S̄'⁻¹ Σ_{j≠k} v_j. What that is, per family, at the fixed point:
    full       exact for a quadratic loss (U_k = A_k/τ, v_k = b_k/τ). With the clients' cross-entropy the remaining
               duals are linearisations at m̄ (U_j = H_j(m̄)/τ, v_j = U_j m̄ - ∇ℓ_j(m̄)/τ), and the result is one
               Newton step from m̄ on the remaining objective Σ_{j≠k} ℓ_j/τ + δ/2 ‖θ‖²: an estimate.
    diagonal   the duals are the sites of IVON's approximate (mean-field) fixed point: an estimate.
    isotropic  (federated ADMM) U_j = 0, v_j = -∇ℓ_j(θ̄): θ̄' = Σ_{j≠k} v_j / δ is one gradient step of size 1/δ on
               Σ_{j≠k} ℓ_j + δ/2 ‖θ‖² from θ̄. Exact is only the removal of k's multiplier; θ̄' is not the optimum
               without k, and there is no covariance to compare (no KL).
               Away from the fixed point the duals are not yet sites, and the formula is off by about how far q̄ is
               from its duals' fixed point (`fixed_point_residual`): after 15 rounds of the FMNIST MLP with the paper's
               settings that is 0.99, and 33 precisions would be <= 0.
  redone step  the last server step (Eqs. 37-38) redone without k (`server_natural_without`): k's local posterior out
               of Mean(...), its duals out of the sums, α' = 1/(1 + ρ(K-1)). Mean(...) runs over the local posteriors
               of the last round's repliers (the latest round among the remaining clients': where k replied alone
               in the last rounds, those rounds without k change nothing). An estimate everywhere: the remaining
               local posteriors were fitted against a q̄ that held k. At the fixed point it gives S̄ - α' U_k,
               S̄ m̄ - α' v_k: 1 - α' of k's site stays (0.64 for ρ = 0.2, K = 10). Under `clip` the remaining duals
               are tempered again among themselves, the local posteriors stay as that round's step moved them.
After the share, `forget` tries the fixed-point formula first where q̄ is within FIXED_POINT_TOLERANCE (1e-2) of its
duals' fixed point, the redone step first elsewhere, and takes the first that makes a posterior (finite, positive
precision); where none does, it refuses, naming each. The note says which it took, why, and the residual; `exact` is
False (exact is only the full family at the fixed point for a quadratic loss, which no client here trains).

For the redone step the server keeps every client's last accepted local posterior, as the server step used it (after
`clip` moved it), with its round (`BayesADMMState.local_posteriors`, checkpointed beside the duals): one Gaussian of
the family's shape beside each client's duals (2P floats for the diagonal family, P + P² for the full one, P for the
isotropic one), in memory and in every checkpoint; the shares (`BayesADMMState.shares`, from the local posteriors
and duals as the step used them, so under `clip` as it moved and tempered them) as much again for the diagonal and
full families. A checkpoint from before either was kept loads with none; the shares then stay none (they add up to q̄
only when kept from round 1), the local posteriors come with the next replies, and until then `forget` has the
fixed-point formula alone (refusing, as before, where that makes no posterior).
"""
