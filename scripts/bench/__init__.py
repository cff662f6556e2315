"""Benchmarks and studies, run from the repository root as ``python -m scripts.bench.<name>``.

The library the scripts share: ``launch`` (run spec, resumable launcher), ``report`` (docs
sections, tables), ``stats`` (means, standard errors, paired differences with t intervals).
"""
