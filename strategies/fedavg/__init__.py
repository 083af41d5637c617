"""FedAvg (McMahan et al., 2017) and FedProx (Li et al., 2020) over the fedbayes wire schema.

Server half: a seeded `fraction-train` of the nodes, and the example-weighted average w = sum_k N_k w_k / sum_k N_k (in
float64) of the replies that pass the checks; with run config `robust-aggregation`, w = w_g + R(w_k - w_g) for R = clip,
median or trimmed-mean (bayes/robust.py). Client half: E local epochs of Adam/SGD on the mean minibatch loss, plus
FedProx's proximal term mu/2 * ||w - w_global||^2 (squared norm, as in the paper; Flower's docstring example uses the
unsquared norm).
"""
