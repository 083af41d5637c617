"""FedPA (Al-Shedivat et al., "Federated Learning via Posterior Averaging", ICLR 2021) over the fedbayes
wire schema; the spec is docs/algorithms/fedpa.md.

Server half (Alg. 1): Δ = Σ n_i Δ_i / Σ n_i, the example-weighted mean of the client deltas, is the
gradient of a torch optimizer over the flat global model (SERVEROPT: SGD with momentum, Adam or
Adagrad). Deltas point "old - new", so the server descends: SGD with lr 1 and no momentum on FedAvg
deltas is FedAvg. The optimizer's state is checkpointed and never reset when the clients switch phase.
The server tells each client whether the round is a burn-in or a sampling round. With run config
`robust-aggregation`, Δ is the clip, median or trimmed-mean of the deltas instead (bayes/robust.py).

Client half. Rounds 1..burn-in-rounds (the released code's 0-based `round >= burn-in` switch):
  burn-in   FedAvg's client exactly (strategies/fedavg.train_locally); Δ = x_0 - θ_final (Alg. 2).
  sampling  IASG (Alg. 4) from x_0: `local-burnin-epochs` epochs are discarded, then each of `samples`
            epochs is averaged into one sample (K = one epoch's minibatch steps, the paper's "one
            sample per epoch"). The samples stream into the dynamic programme of App. C, which returns
            Δ = Σ̂_ℓ⁻¹(x_0 - x̄_ℓ) for the shrinkage covariance Σ̂_ℓ = ρ_ℓ I + (1 - ρ_ℓ) Ŝ_ℓ,
            ρ_ℓ = 1/(1 + (ℓ-1)ρ) (Eq. 10, Thm 3), in O(ℓ²d) time and O(ℓd) memory: no d x d matrix.
Local burn-in: we follow the released code's default of 1 discarded epoch (spec §3.3, pitfall 3); the
paper's fn. 11 reads as 0, which is `local-burnin-epochs=0`. IASG uses FedAvg's client optimizer
(`optimizer`, `lr`), fresh each round, its state carrying over across the epochs of the round.
The sampler is pluggable: anything that hands flat samples to a callback (`ExactGaussianSampler` in
the tests).
"""
