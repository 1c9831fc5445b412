"""The worker pool: the template process and the workers it forks, their supervision and
replacement, where each model's replicas go, and dispatch to them over the rings."""
