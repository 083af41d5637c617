"""FedLap and FedLap-Cov (Swaroop et al., ICLR 2025; docs/algorithms/fedlap.md).

Both keep, per client, a Gaussian site t̂_k ∝ exp(v_k·w − ½ w·diag(V_k) w) (v_k natural: precision times mean),
and the server's global q_g = N(w_g, diag(S_g)^-1) ∝ p_0 Π_k t̂_k with p_0 = N(0, I/δ):
  server:  S_g = δ + Σ_k V_k,   w_g = (Σ_k v_k) / S_g                                    [P Eq. 9, Eq. 21]
  client:  w_k ← argmin ℓ_k(w) + ½ (w − m_k)·P_k (w − m_k)   cavity P_k = S_g − V_k, m_k = (S_g w_g − v_k)/P_k
           S_k = H_k(w_k) − V_k + S_g;  v_k ← v_k + ρ_k (S_k w_k − S_g w_g);  V_k ← V_k + ρ_k (H_k − V_k)  [Eq. 21]
ℓ_k is the client's SUM loss; the client trains on the mean loss + ½ Σ (P_k/N_k)(w − m_k)² (§1.7, P1).
  FedLap:      H_k ≡ 0, so V_k = 0 and S_g = δ: the cavity term is (δ/N_k)/2 ‖w − (w_g − v_k/δ)‖² and the site step
               v_k += ρ_k δ (w_k − w_g) (v_k here is δ times [P]'s v_k). ρ_k = N_k/N ([P] App. E).
  FedLap-Cov:  H_k = the diagonal GGN of ℓ_k at the new w_k (bayes/curvature.py), ρ_k = 1/K ([P] App. E).
Fixed point of both: w* = argmin Σ_k ℓ_k + (δ/2)‖w‖² (§1.7). With Σ_k ρ_k = 1, FedLap's server step is the
average Σ_k ρ_k w_k.

Initialisation (§3.1, §9 P3, "consistent"): the prior stays centred at 0 and w_g starts at the model's initial
weights w_0: the clients of round 1 each start with v_k = S_g w_0 / K₁ (the instruction's `initial_share` = 1/K₁,
K₁ = the nodes round 1 goes to), so Σ_k v_k = δ w_0. The server keeps what no client has claimed (the share of a
round-1 client that never replied) as an unclaimed natural mean, so w_g = (unclaimed + Σ_k v_k)/S_g always.

State and messages: the client keeps (v_k, V_k) in its durable store and sends them after each round (FedLap:
v_k, P floats; FedLap-Cov: 2P); the server keeps the last reported site of every client that ever replied, so a
client that lost its state and starts again from a fresh site simply replaces its old one. Down: w_g (+ S_g).

Bounded influence (run config `robust-aggregation = "clip"`): the server builds q_g from every site tempered to
at most `clip-ratio` x the median norm of the known sites' natural parameters, t̂_k^f with f = clip_factors
(bayes/robust.py): a site with larger natural parameters than the others cannot pull q_g further than that.
The sites it keeps (and the clients hold) are the untempered ones. The screen measures a reply's update as the
change its new site alone would make to q_g, in mean and log precision (`site_change`).

Membership (strategies/base.py Membership): K and N count the clients the server has heard from. A client
joining after round 1 starts with a flat site (v_k = V_k = 0) and counts itself into K and N for its ρ_k; its
ρ_k then makes Σ_k ρ_k exceed 1 for that round, which only affects the transient. Partial participation
(`fraction-train` < 1): non-sampled clients keep their sites, as in PVI.

Forgetting a client (`forget`, docs/guides/forgetting.md): q_g ∝ p_0 Π_k t̂_k at every step, so the server drops
client k's site and rebuilds q_g from the others (`global_from_sites`); K and N (hence every ρ_j) stop counting k.
The unclaimed natural mean stays: it is what no client claimed of the init; the share k claimed is in its site and
goes with it. At the fixed point every site is its client's loss linearised at w* (v_j = V_j w* − ∇ℓ_j(w*), V_j =
diag H_j(w*) for FedLap-Cov, 0 for FedLap), so the result is one step w* − (δ + Σ_{j≠k} V_j)⁻¹ ∇F'(w*) on the remaining
MAP objective F' = Σ_{j≠k} ℓ_j + (δ/2)‖w − unclaimed/δ‖²: FedLap-Cov's is a Newton step with the diagonal curvature,
exact (the posterior without k) for a quadratic loss whose curvature is diagonal; FedLap's is a gradient step of size
1/δ, an estimate even for a quadratic loss. The remaining sites stay, so ordinary rounds among the remaining clients
refine it to the fixed point without k.
"""
