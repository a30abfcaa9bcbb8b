"""The training-aware rollout processor.

Samples n completions per prompt from a vLLM-compatible `/v1/completions` endpoint with token-id
prompts, keeps every sample's token contract (prompt ids, completion ids, processed logprobs, finish
reason, truncation, policy version), builds multi-turn conversations by appending token ids, and runs
evaluator bundles through an OpenAI-shaped chat client that records all of it.
"""

from .bundle import EvaluatorBundle, load_bundle
from .chat_client import ChatClient, SyncChatClient
from .chat_template import ChatTokenizer
from .client import InferenceClient
from .conversation import TokenConversation, TurnSpan
from .episodes import build_episode, episode_id, episode_json
from .errors import (
    BundleError,
    ChatTemplateError,
    InferenceHTTPError,
    InferenceUnavailableError,
    RolloutError,
    RolloutInfraError,
    SampleAborted,
    TokenContractError,
)
from .outcome import score_view
from .recorder import DEFAULT_TRAJECTORY, RecordedSample, RecordedTrajectory, RolloutRecorder
from .retry import RetryPolicy
from .sampling import SamplingParams, engine_sample
from .worker import RolloutWorker, Scorer

__all__ = [
    "BundleError", "ChatClient", "ChatTemplateError", "ChatTokenizer", "DEFAULT_TRAJECTORY",
    "EvaluatorBundle", "InferenceClient", "InferenceHTTPError", "InferenceUnavailableError",
    "RecordedSample", "RecordedTrajectory", "RetryPolicy", "RolloutError", "RolloutInfraError",
    "RolloutRecorder", "RolloutWorker", "SampleAborted", "SamplingParams",
    "Scorer", "SyncChatClient", "TokenContractError", "TokenConversation", "TurnSpan",
    "build_episode", "engine_sample", "episode_id", "episode_json", "load_bundle", "score_view",
]
