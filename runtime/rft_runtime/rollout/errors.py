"""Errors raised by the training-aware rollout processor.

Infrastructure errors (`RolloutInfraError` and subclasses) mean the task could not be rolled out and
should be re-leased; a bundle's own exceptions are recorded on the episode instead.
"""

from __future__ import annotations


class RolloutError(Exception):
    """Base class of every error raised by `rft_runtime.rollout`."""


class RolloutInfraError(RolloutError):
    """The inference side failed (unreachable, protocol violation): the task should be retried."""


class TokenContractError(RolloutInfraError):
    """A response violates the token contract (lengths, echoed prompt ids, token ids, logprobs).

    Never papered over by padding or truncation: the sample is unusable for training.
    """


class InferenceHTTPError(RolloutInfraError):
    """The server refused a request with a non-retryable status (4xx other than 425/429)."""

    def __init__(self, status: int, message: str, *, url: str, param: str | None = None) -> None:
        self.status = status
        self.server_message = message
        self.url = url
        self.param = param
        where = f" (parameter {param})" if param else ""
        super().__init__(f"inference server {url} answered {status}: {message}{where}")

    @property
    def is_request_error(self) -> bool:
        """True when this request itself was refused (400/413/422: e.g. the context is too long),
        as opposed to a configuration problem (401/403/404) that fails every request."""
        return self.status in (400, 413, 422)


class InferenceUnavailableError(RolloutInfraError):
    """Retries were exhausted or the per-request deadline passed; carries the last failure."""

    def __init__(self, message: str, *, attempts: int, last_error: str) -> None:
        self.attempts = attempts
        self.last_error = last_error
        super().__init__(f"{message} after {attempts} attempt(s); last error: {last_error}")


class SampleAborted(RolloutInfraError):
    """The engine aborted the sample (finish_reason "abort"); the request is retried."""


class ReplicaBehind(SampleAborted):
    """The replica that answered serves an older policy version than the one the task was granted
    (it restarted, or has not taken the newest version yet): the sample is discarded and the request
    retried, by when the trainer has brought that replica (or another answers) to the version."""


class ChatTemplateError(RolloutError):
    """The chat template cannot be extended by appending token ids (it is not prefix-stable)."""


class BundleError(RolloutError):
    """An evaluator bundle could not be loaded or does not follow the bundle interface."""


class PromptTooLong(RolloutError):
    """A task's rendered prompt has more tokens than ``rollout.maxPromptTokens``: the task cannot be
    sampled as configured (a property of the data, so it is not retried)."""

    def __init__(self, tokens: int, limit: int) -> None:
        self.tokens = tokens
        self.limit = limit
        super().__init__(f"prompt_too_long: the task's prompt is {tokens} tokens, above rollout.maxPromptTokens "
                         f"({limit})")


class MaxTurnsReached(RolloutError):
    """A rollout asked for more assistant turns than ``rollout.maxTurns`` allows in one conversation;
    the episode ends there (termination reason ``max_turns``) and is scored as it stands."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"max_turns: the conversation reached rollout.maxTurns ({limit}) assistant turns")
