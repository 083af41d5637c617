"""fedbayes: networked Bayesian federated learning on Flower.

Every module is imported under this package, in the checkout as installed: fedbayes.bayes, fedbayes.protos,
fedbayes.tasks, fedbayes.strategies, fedbayes.client, fedbayes.server, fedbayes.posterior, fedbayes.deploy. Each is a
top-level folder of the repository, linked here (docs/architecture.md has the layers and which may import which).
"""
