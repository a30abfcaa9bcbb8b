"""Names fixed by the API: group/version/kind and the enums shared with the runtime's registries.

Each enumeration is written once, as the ``Literal`` the spec's fields use; the tuple beside it is
derived from it. The runtime's registries must have exactly these keys; tests compare them.
"""
from typing import Literal, get_args

GROUP = "rft.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RFTJob"
PLURAL = "rftjobs"
SINGULAR = "rftjob"
SHORT_NAMES = ["rft"]

AlgorithmName = Literal["grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "reinforce_pp"]
ALGORITHMS: tuple[str, ...] = get_args(AlgorithmName)
AdvantageEstimatorName = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline"]
ADVANTAGE_ESTIMATORS: tuple[str, ...] = get_args(AdvantageEstimatorName)
PolicyLossName = Literal["ppo_clip", "gspo", "cispo", "reinforce"]
POLICY_LOSSES: tuple[str, ...] = get_args(PolicyLossName)
LossAggregationName = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGGREGATIONS: tuple[str, ...] = get_args(LossAggregationName)
KLEstimatorName = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimatorName)
BuiltinEvaluatorName = Literal["math", "string_check", "regex", "code_sandbox", "llm_judge"]
BUILTIN_EVALUATORS: tuple[str, ...] = get_args(BuiltinEvaluatorName)
BUILTIN_MODELS = ("builtin:tiny", "builtin:tiny-vllm")  # the runtime builds them (rft_runtime.model.builtin)
BuiltinDatasetName = Literal["arithmetic", "gsm8k_synth"]
BUILTIN_DATASETS: tuple[str, ...] = get_args(BuiltinDatasetName)
EngineName = Literal["builtin", "vllm"]
ENGINES: tuple[str, ...] = get_args(EngineName)
Phase = Literal["Pending", "Provisioning", "Running", "Succeeded", "Failed", "Suspended", "ValidationFailed"]
PHASES: tuple[str, ...] = get_args(Phase)
TERMINAL_PHASES = ("Succeeded", "Failed", "ValidationFailed")
ConditionType = Literal[
    "InferenceReady", "RewardReady", "RolloutReady", "TrainerRunning", "Succeeded", "Failed", "Suspended",
    "InputsReady", "OutputPushed",
]
# Conditions a job has only when its spec asks for what they report: InputsReady with hf:// or s3://
# inputs, OutputPushed with spec.output.
OPTIONAL_CONDITION_TYPES = ("InputsReady", "OutputPushed")
CONDITION_TYPES: tuple[str, ...] = get_args(ConditionType)
# Algorithms whose advantages are computed relative to a group of samples of the same prompt
# (reinforce_pp uses the group-mean baseline variant, REINFORCE++-baseline).
# (every preset today; a preset that is not group-relative would be left out here).
GROUP_RELATIVE_ALGORITHMS: tuple[str, ...] = ALGORITHMS

# No default image here: a job that names none gets the operator's configured images (its --runtime-image
# and --vllm-image, the chart's images.runtime and images.vllm).
# The --max-lora-rank values vLLM accepts; the inference builder rounds spec.model.lora.rank up to one.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

# Rewards. A reward outside an evaluator's range (``rewardRange``, this default when unset) is refused at
# scoring; no reward beyond REWARD_LIMIT is accepted anywhere (the coordinator refuses the episode).
# Within it the advantage estimators' float32 arithmetic cannot overflow (differences, squares and sums
# of a step's rewards stay far below 3.4e38).
DEFAULT_REWARD_RANGE = (-1.0e6, 1.0e6)
REWARD_LIMIT = 1.0e9

# Environment variables the operator sets in the job's containers (the job token, the engine's API key,
# credentials, endpoints, caches): a spec's env may not name them, or it would replace them. (Other
# RFT_* variables, such as RFT_ENGINE_KERNELS, are the user's to set.)
RESERVED_ENV_NAMES = (
    "RFT_JOB_TOKEN", "RFT_HF_TOKEN", "RFT_S3_ACCESS_KEY_ID", "RFT_S3_SECRET_ACCESS_KEY", "RFT_TRAINER_ATTEMPT",
    "RFT_BIND_HOST", "RFT_METRIC_JOB", "RFT_METRIC_NAMESPACE", "RFT_METRIC_ROLE", "VLLM_API_KEY",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "POD_IP", "HOME", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_HOME", "XDG_CACHE_HOME",
)
RESERVED_ENV_PREFIX = "RFT_EVALUATOR_"  # the evaluators' API keys (rft_api.layout.api_key_env_name)
# Where the operator mounts its own volumes in the job's pods: a data volume may not be mounted on, in or
# over one of them.
RESERVED_MOUNT_PATHS = ("/etc/rft", "/checkpoints", "/var/cache/rft", "/tmp", "/mnt/claims", "/dev/shm")
# The largest evaluator config accepted: the job's runtime config, which holds it, travels in a ConfigMap
# (at most 1 MiB with everything else in it).
MAX_EVALUATOR_CONFIG_BYTES = 256 * 1024

# Why a trainer stopped with its terminal status (exit 2), written first in its termination message
# ("rft trainer: <Reason>: <message>"): the operator fails the job with that reason (else with
# TrainerTerminalError).
TRAINER_TERMINAL_REASONS = (
    "CheckpointLost",        # the progress record lists checkpoints the checkpoint volume no longer holds
    "CheckpointVolumeFull",  # a checkpoint or a publication ran out of space (or quota) on the volume
    "NonFiniteTraining",     # trainer.maxNonFiniteSteps steps in a row had a gradient that is not finite
    "NonFiniteWeights",      # the weights stopped being finite after a step
    "InvalidDataset",        # a dataset file, row or option cannot be used
    "ModelLoadFailed",       # the model (or its LoRA target modules) cannot be built
    "CannotResume",          # a checkpoint this run cannot continue (another algorithm, dataset, ...)
    "InvalidConfig",         # the runtime config or the trainer's settings cannot be used
)
TRAINER_REASON_PREFIX = "rft trainer: "

# A Failed job is retried (resumed from its latest checkpoint, without being deleted) when this annotation
# holds a number above status.retry.count (kubectl rft resume sets it), or when its spec is edited.
RETRY_ANNOTATION = "rft.dev/retry"

# Label and annotation prefixes the operator owns on the job's pods (its selectors, roles, hashes, Kueue's
# and the Job controller's keys): a role's pod overrides may not set keys under them.
RESERVED_LABEL_PREFIXES = ("app.kubernetes.io/", "rft.dev/", "kueue.x-k8s.io/", "batch.kubernetes.io/")
# Builtin evaluators that always score in the reward role (never in the rollout pods that run user code).
REMOTE_EVALUATORS = ("code_sandbox", "llm_judge")
