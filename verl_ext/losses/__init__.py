"""Policy losses for verl's ``register_policy_loss`` registry (see ``registration.py``)."""
