"""The vLLM gate: the job's front door to a vLLM server in the same pod (``rft gate``).

vLLM listens on the pod's loopback only; the gate listens on the inference port and is the one way in:

- **Every route requires the job token** (:mod:`rft_runtime.auth`; ``/health`` and ``/metrics`` stay
  open, as on every role), and only the routes a job uses are forwarded: the OpenAI API (``/v1/...``:
  generation, models, LoRA adapter loading), ``/tokenize``, ``/detokenize``, ``/version``. vLLM's
  development and RL routes (``/collective_rpc``, ``/pause``, ``/update_weights``, ``/reset_prefix_cache``,
  ``/sleep``, ...) answer 404 from outside, token or not: only the gate calls them, on loopback.
- **Full weights every step** (``inference.weightSync: disk``): the gate speaks the trainer's reload
  protocol (:class:`rft_runtime.trainer.reload.DiskReload`, the builtin server's routes):
  ``POST /update_weights_from_disk {"model_path", "policy_version"}`` and ``GET /get_policy_version``.
  An update drains first: new requests wait at the gate, the ones in flight finish on the weights they
  started with (past ``--drain-timeout`` vLLM aborts them, ``/pause?mode=abort``, and the rollout retries
  them); then vLLM reloads the safetensors directory in place (``reload_weights`` through
  ``/collective_rpc``, no restart), its prefix cache is reset, its weight version set, and the waiting
  requests go on. Every answer carries ``x-policy-version``: the version the whole request ran on.
- **A replica that starts serves the current version before it is Ready**: ``/health`` answers 503 until
  vLLM is up and the version the trainer last published (``current.json``) is loaded; until a version is
  published the gate reports -1, which the trainer replaces with the current one.
"""
