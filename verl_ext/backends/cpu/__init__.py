"""The cpu backend: a ``cpu`` verl platform and verl's FSDP engines for device ``cpu``; with the
``hf`` rollout (``verl_ext.backends.hf``) and a few guarded patches, verl's real PPO trainer runs
end to end on a CPU-only machine with a tiny model.
A development and CI backend, not a way to train real models."""
