"""verl agent loops provided by verl-ext (registered through ``registration``)."""
