"""Which roles a job runs, with how many replicas (pure, from the spec).

The reward role (a Deployment + Service running ``rft reward``) exists when scoring should not happen
inside the rollout pods:

- ``evaluator.remote: true`` — the user asked for it (isolation or a large scorer);
- a ``code_sandbox`` evaluator — it executes model-generated code, which must not run next to the
  rollout pods' access to the coordinator and inference;
- an ``llm_judge`` evaluator — its API key Secret is then given only to the reward pods, never to
  the rollout pods that run the user's bundle code.

Every other evaluator (math, string_check, regex, a bundle, a Python file) scores in the rollout pods.
The reward role runs ``spec.reward.replicas`` pods (one by default).
"""
from __future__ import annotations

from rft_api.spec import RFTJobSpec

REMOTE_BUILTINS = ("code_sandbox", "llm_judge")
DEPLOYMENT_ROLES = ("inference", "reward", "rollout")


def reward_required(spec: RFTJobSpec) -> bool:
    """Whether the job gets a reward Deployment + Service (see the module docstring)."""
    ev = spec.evaluator
    return ev.remote or any(e.builtin in REMOTE_BUILTINS for e in ev.entries())


def checkpoint_sharing(spec: RFTJobSpec) -> tuple[str, bool]:
    """``(access mode of the checkpoint claim, co-locate)``: the pods that mount the claim (every
    trainer pod and inference replica) share it through ReadWriteMany, or, on a ReadWriteOnce claim,
    are scheduled onto one node together (``co-locate``, needed only when more than one pod mounts
    it). ``Auto`` is ReadWriteMany for several trainer nodes, else ReadWriteOnce."""
    cp = spec.checkpoint
    mode = cp.access_mode
    if mode == "Auto":
        mode = "ReadWriteMany" if spec.trainer.nodes > 1 and cp.existing_claim is None else "ReadWriteOnce"
    mounts = spec.trainer.nodes + spec.inference.replicas
    return mode, mode == "ReadWriteOnce" and mounts > 1


def desired_replicas(spec: RFTJobSpec) -> dict[str, int]:
    """Replicas per role when the job's workloads run (``trainer`` counts pods, i.e. nodes)."""
    return {
        "inference": spec.inference.replicas,
        "reward": (spec.reward.replicas if spec.reward is not None else 1) if reward_required(spec) else 0,
        "rollout": spec.rollout.replicas,
        "trainer": spec.trainer.nodes,
    }
