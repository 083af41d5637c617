"""FedLap-Func (Swaroop et al., ICLR 2025, §3.4, Eq. 15-17, App. C and E; docs/algorithms/fedlap-func.md).

FedLap (strategies/fedlap) plus function-space information on a few memory points M_k per client: soft predictions
ŷ_i = softmax f(x_i; w_k) on its own training inputs x_i, i ∈ M_k, weighted by τ_i = τ_f · N_{k,c}/M_{k,c} (c the
class of point i, N_{k,c} the client's examples of class c, M_{k,c} its memory points of class c; [P] App. E), with
ℓ(ŷ, w) = −Σ_c ŷ_c log softmax f(x; w)_c summed, not averaged, over the points ([P] Eq. 17; ℓ_k is the SUM loss):

  server:  w_lap = (unclaimed + Σ_k v_k)/δ                                        (FedLap's global, [P] Eq. 9)
           w_g ← argmin Σ_k Σ_{i∈M_k} τ_i ℓ(ŷ_i, w) + (δ/2)‖w − w_lap‖²   by E_g full-batch Adam steps from w_lap
                                                                                  ([P] Eq. 17 server, App. E)
  client:  w_k ← argmin ℓ_k(w) + (δ/2)‖w − (w_g − v_k/δ)‖² + Σ_{i∈M_k} τ_i [ℓ(ŷ_{i,g}, w) − ℓ(ŷ_i, w)]
           v_k ← v_k + ρ_k δ (w_k − w_g),   ρ_k = N_k/N                           ([P] Eq. 17 client, App. E)

ŷ_i in the client's objective is its prediction at its previous w_k (the one the server fitted w_g to), ŷ_{i,g} the
global model's (the client computes it from w_g); the server fits the predictions just sent. With M_k = ∅
(`memory-points-per-class = 0`) this is FedLap exactly; at a stationary point (w_g = w_k, ŷ_i = ŷ_{i,g}) every
function-space term has zero gradient, so the fixed point is FedLap's, argmin Σ_k ℓ_k + (δ/2)‖w‖² ([P] §3.4).

The deviation from [P], for privacy. [P]'s client objective has the global function-space term over EVERY client's
memory points, Σ_{k'} Σ_{i∈M_k'} τ_i ℓ(ŷ_{i,g}, w), so [P]'s server must send the pooled memory inputs, other
clients' raw training examples, to every client. Here each client's global term is on its own points alone: it
swaps its own previous function-space site for the global one on M_k, and no memory input leaves the server. What
that leaves out of the client's objective is R_k(w) = Σ_{j≠k} Σ_{i∈M_j} τ_i ℓ(ŷ_{i,g}, w), which is, up to a
constant, Σ τ_i KL(ŷ_{i,g} ‖ softmax f(x_i; w)): zero, with zero gradient, at w = w_g (where local training
starts) and ≥ 0 elsewhere, a trust region keeping the client's function on the other clients' inputs near the
global's. Without it only FedLap's weight-space term (δ/2)‖w − m_k‖² does; the terms kept on M_k are exactly linear
in the logits, Σ_i τ_i (ŷ_i − ŷ_{i,g})·f(x_i; w) (the soft cross-entropies' normaliser cancels). Its weight, with
Σ τ_i = τ_f N_j per client, is τ_f (N − N_k) in sum units: for a small client in mean units τ_f (N − N_k)/N_k, many
times τ_f. The server's objective and the fixed point are [P]'s: R_k's gradient vanishes at every stationary point.

What leaves a client: its site v_k every round (P floats, as FedLap), its soft predictions on M_k every round
(M_k × C floats), and ONCE, in the first round it replies without state, its memory inputs (M_k raw training
examples, their labels not sent) with, per point, N_{k,c}/M_{k,c} (which tells the server how many of the client's
examples each point stands for: equal values share a class). The server keeps the inputs in its state (and its
checkpoints) and sends them to no one; forgetting the client removes them (`forget`).

Memory (`memory-points-per-class` m, default 1 as [P]): a client without state draws m of its examples per class it
holds (all of a class with fewer), from its own seed of the run seed, so a client that lost its state draws the same
ones again; it keeps their indices and its newest predictions in its durable store. The server refuses a reply whose
memory inputs differ from those the client sent before, memory inputs from a client that resumes, more points than
m × C, predictions that are not probability vectors, and per-point counts that do not sum to N_k.

State and messages: the client keeps (v_k, its memory indices, its newest predictions); the server keeps FedLap's
state with w_g = the fit, and per client (x_i, N_{k,c}/M_{k,c}, ŷ_i). Down: w_g (P). The fit costs O(M P E_g) on the
server each round (M = Σ_k M_k), the client O(N_k P E + M_k P E).

Forgetting a client: FedLap's (its site leaves and w_lap is rebuilt from the others), its memory inputs and
predictions leave the state, and w_g is fitted again to the others' points.
"""
