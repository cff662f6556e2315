"""verl datasets built from the envs: SFT transcripts of oracle demonstrations (``demos``) and the
single-turn decision prompts of the RFT stage (``decisions``). They import verl; ``verl_ext.envs`` does not
need them."""
