"""The coordinator API's wire format (contract 4 in docs/architecture.md): one model per message.

Both sides of the API hold these types, never the raw JSON: the coordinator parses each request body
once (:meth:`Wire.parse`: a body that does not fit is a :class:`WireError` naming the field, answered
400), builds its answers as models, and the rollout worker's client parses each answer once into them.
The JSON field names are the models' field names, unchanged from the untyped API (rollout pods and
trainers of one version talk to each other). Unknown fields are ignored, so a peer may add one.

=====================  ==================================  ==================================
route                  request                             answer (200)
=====================  ==================================  ==================================
``POST /v1/lease``     :class:`LeaseRequest`               :class:`LeaseResponse` (grants:
                                                           :class:`LeaseGrant`)
``POST /v1/episodes``  :class:`PostEpisodesRequest`        :class:`PostEpisodesResponse`
                                                           (also the body of a 409/422)
``POST /v1/release``   :class:`ReleaseRequest`             :class:`ReleaseResponse`
``GET /v1/status``     —                                   :class:`CoordinatorStatus`
``GET /health``        —                                   :class:`Health`
=====================  ==================================  ==================================

Errors are :class:`ErrorBody` (``{"error": {"message", "field"}}``).

Episodes are the one part typed elsewhere: a post's envelope is parsed here, its episodes stay JSON
objects (``list[Any]``) until the coordinator has triaged them
(:mod:`rft_runtime.coordinator.episodes`, then :class:`rft_runtime.types.Episode`); the rollout side
sends them pre-encoded (:mod:`rft_runtime.rollout.posting`). A large post is thus decoded once, and its
episodes validated once, by the type that owns them.

**The group size** ``n`` has one source for a leased task: its grant (:attr:`Assignment.n`). The
trainer chooses it per submission (``rollout.samplesPerPrompt`` for training, ``evaluation.samplesPerPrompt``
for evaluation tasks, so a grant's ``n`` need not equal the coordinator's default), the coordinator
expects exactly that many episodes (``rollout_idx`` in ``0..n-1``), and the rollout worker samples
exactly that many. The rule (an integer >= 1, :data:`GroupSize`) is checked where the value is built:
the coordinator's default (:class:`~rft_runtime.coordinator.core.CoordinatorConfig`) and each submission
(an :class:`Assignment`); the rollout side checks it once more when it parses the grant, and trusts it
from then on. The job's ``rollout.samplesPerPrompt`` is, on the rollout side, only an estimate of the
next grants' size (how many tasks one lease asks for), never the size of a task.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Mapping, Optional, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    model_serializer,
)

__all__ = [
    "MAX_LEASE_WAIT_S", "OUTCOMES", "Assignment", "CoordinatorStatus", "ErrorBody", "ErrorDetail", "GroupSize",
    "Health", "LeaseGrant", "LeaseRequest", "LeaseResponse", "PostEpisodesRequest", "PostEpisodesResponse",
    "ReleaseRequest", "ReleaseResponse", "Sampling", "TaskStates", "Wire", "WireError", "check_group_size",
]

MAX_LEASE_WAIT_S = 60.0
"""The longest ``wait_s`` a lease may ask for."""

OUTCOMES = ("accepted", "duplicate", "stale", "unknown", "refused", "invalid")
"""The outcome lists of an episode post, in :class:`PostEpisodesResponse`."""

GroupSize = Annotated[StrictInt, Field(ge=1)]
"""Samples of one task (a group's size, ``n``): an integer >= 1."""
Count = Annotated[StrictInt, Field(ge=0)]
NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
Seconds = Annotated[StrictFloat, Field(gt=0)]

_GROUP_SIZE: TypeAdapter[int] = TypeAdapter(GroupSize)


def check_group_size(n: Any, what: str) -> int:
    """``n`` when it is a :data:`GroupSize`; else ValueError ``"{what} must be an integer >= 1, got ..."``."""
    try:
        return _GROUP_SIZE.validate_python(n)
    except ValidationError:
        raise ValueError(f"{what} must be an integer >= 1, got {n!r}") from None


class WireError(ValueError):
    """A message that does not fit its model. ``field``: the top-level field at fault (None: the body)."""

    def __init__(self, message: str, field: str | None) -> None:
        super().__init__(message)
        self.field = field


class Wire(BaseModel):
    """A coordinator API message: frozen, unknown fields ignored, numbers finite."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    rules: ClassVar[Mapping[str, str]] = {}
    """What a top-level field must be, in words: the message of a 400 that names it."""

    @classmethod
    def parse(cls, data: Any) -> Self:
        """``data`` (decoded JSON) as this message; raises :class:`WireError` naming the first field at fault."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            loc = tuple(first.get("loc", ()))
            if not loc:
                raise WireError("body must be a JSON object", None) from None
            field = str(loc[0])
            rule = cls.rules.get(field)
            message = (f"{field} must be {rule}" if rule else
                       f"{'.'.join(str(x) for x in loc)}: {first.get('msg')}")
            raise WireError(message, field) from None

    def json_bytes(self) -> bytes:
        """The message's JSON (what goes on the wire)."""
        return self.model_dump_json().encode()


# ------------------------------------------------------------------------------------------ lease

class LeaseRequest(Wire):
    """``POST /v1/lease``: a worker asks for up to ``max_tasks`` tasks (capped at the coordinator's
    ``max_lease_tasks``). ``wait_s`` long-polls: with no task to grant, the answer waits until one is
    (submitted, given back or re-queued), the run is done, or ``wait_s`` passed, whichever is first."""

    rules: ClassVar[Mapping[str, str]] = {
        "worker_id": "a non-empty string",
        "max_tasks": "an integer >= 1",
        "wait_s": f"a number of seconds from 0 to {MAX_LEASE_WAIT_S:g}",
    }

    worker_id: NonEmptyStr
    max_tasks: Annotated[StrictInt, Field(ge=1)] = 1
    wait_s: Annotated[StrictFloat, Field(ge=0, le=MAX_LEASE_WAIT_S)] = 0.0


class Sampling(Wire):
    """The sampling fields a grant hands out (vLLM names); a field not set is left out of the JSON and
    the worker's engine default (the job's ``rollout`` settings) applies. Ranges are the engine
    request's to check (:class:`rft_runtime.rollout.sampling.SamplingParams`)."""

    max_tokens: Optional[StrictInt] = None
    temperature: Optional[StrictFloat] = None
    top_p: Optional[StrictFloat] = None
    top_k: Optional[StrictInt] = None

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class Assignment(Wire):
    """What to sample for one submitted task: the part of a grant fixed at submission.

    ``task`` is the task in ``Task.to_dict()`` form (checked by :class:`rft_runtime.data.task.Task` where
    it is rolled out); ``n`` its group size (see the module docstring: the grant's ``n`` is the task's);
    ``seed`` the sampling seed of sample 0 (sample ``i`` uses ``seed + i``)."""

    task_key: NonEmptyStr
    task: dict[str, Any]
    n: GroupSize
    seed: Count
    sampling: Sampling = Sampling()
    purpose: Literal["train", "eval"] = "train"


class LeaseGrant(Assignment):
    """One leased task. ``lease_id`` is unguessable: posting the task's episodes requires it.
    ``policy_version``: the version served when it was granted (its samples must come from it or a
    newer one); ``deadline_in_s``: seconds until the lease expires and the task is re-issued (relative:
    clocks differ between hosts)."""

    lease_id: NonEmptyStr
    policy_version: Count
    deadline_in_s: Optional[Seconds] = None


class LeaseResponse(Wire):
    """The answer to a lease. ``done``: no more work (stop leasing); ``finished``: done because training
    completed (else the trainer is stopping and a later attempt resumes the run; a coordinator that
    does not say is taken to mean completed)."""

    done: StrictBool
    finished: StrictBool = True
    policy_version: Count
    lease_timeout_s: Seconds
    tasks: list[LeaseGrant] = []


# ------------------------------------------------------------------------------------------ episodes

class PostEpisodesRequest(Wire):
    """``POST /v1/episodes``: episodes of the leases ``lease_ids`` (the proof of holding them). The
    episodes are JSON objects, triaged and checked by the coordinator one by one (see the module
    docstring); only the envelope is typed here."""

    rules: ClassVar[Mapping[str, str]] = {
        "worker_id": "a non-empty string",
        "lease_ids": "the list of lease ids the poster holds",
        "episodes": "a list of episode objects",
    }

    worker_id: NonEmptyStr
    episodes: list[Any]
    lease_ids: list[StrictStr]


class ErrorDetail(Wire):
    """What went wrong, and the request field at fault (None: the request as a whole)."""

    message: str
    field: Optional[str] = None


class PostEpisodesResponse(Wire):
    """The outcome of each posted episode, by id (posting is idempotent by id): ``accepted``,
    ``duplicate`` (seen before), ``stale`` (too old a policy), ``unknown`` (no such task), ``refused``
    (the poster does not hold the task's live lease), ``invalid`` (bad fields; None for an episode
    without a string id); ``errors`` says why, one message per refused or invalid episode. A post
    with a refused (409) or invalid (422) episode is answered with ``error`` naming the first."""

    accepted: list[str]
    duplicate: list[str]
    stale: list[str]
    unknown: list[str]
    refused: list[str]
    invalid: list[Optional[str]]
    errors: list[str]
    error: Optional[ErrorDetail] = None

    def json_bytes(self) -> bytes:
        """The JSON, without ``error`` unless set (a 200's body has none)."""
        return self.model_dump_json(exclude=None if self.error is not None else {"error"}).encode()


# ------------------------------------------------------------------------------------------ release

class ReleaseRequest(Wire):
    """``POST /v1/release``: give leased tasks back for immediate re-issue (a worker that cannot finish them)."""

    rules: ClassVar[Mapping[str, str]] = {"lease_ids": "a list of strings", "reason": "a string"}

    lease_ids: list[StrictStr]
    reason: StrictStr = ""


class ReleaseResponse(Wire):
    """How many of the leases were live and are given back."""

    released: Count


# ------------------------------------------------------------------------------------------ status

class TaskStates(Wire):
    """Tasks by state."""

    queued: Count = 0
    leased: Count = 0
    complete: Count = 0


class CoordinatorStatus(Wire):
    """``GET /v1/status``: the policy version served, the staleness mode, tasks by state and every counter
    (:data:`rft_runtime.coordinator.core.COUNTER_NAMES`)."""

    done: StrictBool
    policy_version: Count
    mode: Literal["on-policy", "bounded-staleness"]
    max_staleness: Count
    tasks: TaskStates
    counters: dict[str, Count]


class Health(Wire):
    """``GET /health``."""

    ok: StrictBool = True


class ErrorBody(Wire):
    """The body of an error answer."""

    error: ErrorDetail
