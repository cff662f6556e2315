"""Repository scripts (not part of the installed package: the wheel ships ``verl_ext`` only)."""
