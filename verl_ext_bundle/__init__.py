"""Packaging tools of verl-ext, outside the runtime package ``verl_ext``: ``verl-ext bundle`` builds
and installs an offline install bundle (``verl_ext_bundle.bundle``) and brings verl's Megatron
stack to a machine without a package index (``verl_ext_bundle.megatron_stack``).

Both modules import only the standard library at module level: the bundle ships them as its own
installer (``bundle_install.py``, ``megatron_stack.py``), which runs before anything is installed.
"""
