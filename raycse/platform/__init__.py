"""The ground floor's platform services: the Ray session and the run registry, capacity, outputs (staged
locally, published to object storage), credentials masked, processes and signals, the machine and its caches,
and the one home of private library names (compat)."""
