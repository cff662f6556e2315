"""The cpu backend: a ``cpu`` verl platform, an ``hf`` rollout replica and a few guarded patches,
so verl's real PPO trainer runs end to end on a CPU-only machine with a tiny model.
A development and CI backend, not a way to train real models."""
