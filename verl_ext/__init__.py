"""verl-ext: plugins for verl 0.9.1.

Importing this package is cheap: it installs post-import hooks (see ``verl_ext.plugin``) so each
plugin registers itself into verl's registries at the moment verl imports that registry, and
never imports torch or an accelerator runtime on its own.
"""

__version__ = "0.1.0"
VERL_VERSION = "0.9.1"
