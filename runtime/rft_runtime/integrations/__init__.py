"""Integrations with peer frameworks: :mod:`.eval_protocol` (Eval Protocol's rollout processor API).

Import the submodule; each needs its framework installed (an optional extra of ``rft-operator``)."""
