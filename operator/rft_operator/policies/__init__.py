"""Job policies, one module each: phase machine, failure and restart budget, suspend, checkpoint view.

Every function here is pure: inputs are the spec, the previous status and the observation.
"""
