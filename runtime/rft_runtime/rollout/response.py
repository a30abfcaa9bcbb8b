"""Parse a vLLM `/v1/completions` response into `Sample`s, enforcing the token contract."""

from __future__ import annotations

from typing import Any, Mapping

from ..types import Sample
from .errors import SampleAborted, TokenContractError
from .sampling import check_ids, engine_sample

TOKEN_ID_PREFIX = "token_id:"
POLICY_VERSION_HEADER = "x-policy-version"


def parse_completions(
    body: Any,
    headers: Mapping[str, str],
    *,
    prompt_ids: list[int],
    n: int,
    max_tokens: int,
    seeds: list[int | None],
    policy_version: int | None,
    server: str,
    require_prompt_echo: bool = True,
) -> list[Sample]:
    """Turn one response body into `n` samples ordered by choice index.

    Raises `TokenContractError` on any violation (missing token ids, a logprob count that differs from
    the token count, token ids that disagree with the `token_id:N` strings, echoed prompt ids that
    differ from those sent, more than `max_tokens` tokens) and `SampleAborted` on finish_reason "abort".
    """
    if not isinstance(body, Mapping) or not isinstance(body.get("choices"), list):
        raise TokenContractError(f"{server}: response has no 'choices' list")
    choices = body["choices"]
    if len(choices) != n:
        raise TokenContractError(f"{server}: asked for n={n} completions, got {len(choices)} choices")
    by_index: dict[int, Mapping[str, Any]] = {}
    for pos, choice in enumerate(choices):
        idx = choice.get("index", pos) if isinstance(choice, Mapping) else None
        if not isinstance(idx, int) or not 0 <= idx < n or idx in by_index:
            raise TokenContractError(f"{server}: choice {pos} has invalid or duplicate index {idx!r}")
        by_index[idx] = choice
    version = response_policy_version(body, headers)
    out = []
    for idx in range(n):
        choice = by_index[idx]
        choice_version = _int_or_none(choice.get("policy_version"), "choices[].policy_version")
        v = choice_version if choice_version is not None else version
        out.append(
            parse_choice(
                choice,
                body=body,
                prompt_ids=prompt_ids,
                max_tokens=max_tokens,
                seed=seeds[idx],
                policy_version=v if v is not None else policy_version,
                server=server,
                require_prompt_echo=require_prompt_echo,
            )
        )
    return out


def parse_choice(
    choice: Mapping[str, Any],
    *,
    body: Mapping[str, Any],
    prompt_ids: list[int],
    max_tokens: int,
    seed: int | None,
    policy_version: int | None,
    server: str,
    require_prompt_echo: bool = True,
) -> Sample:
    """One choice → `Sample`, with every token-contract check of `parse_completions`."""
    idx = choice.get("index", 0)
    where = f"{server}: choice {idx}"
    finish = choice.get("finish_reason")
    if finish == "abort":
        raise SampleAborted(f"{where}: the engine aborted the sample")
    ids = _completion_ids(choice, where)
    logprobs = _token_logprobs(choice, where, len(ids))
    _check_prompt_echo(choice, body, prompt_ids, where, require_prompt_echo)
    if len(ids) > max_tokens:
        raise TokenContractError(f"{where}: {len(ids)} completion tokens exceed max_tokens={max_tokens}")
    if finish not in ("stop", "length"):
        raise TokenContractError(f"{where}: unexpected finish_reason {finish!r}")
    text = choice.get("text")
    return engine_sample(
        prompt_ids=list(prompt_ids),
        completion_ids=ids,
        logprobs=logprobs,
        finish_reason=finish,
        policy_version=policy_version,
        text=text if isinstance(text, str) else "",
        seed=seed,
        stop_reason=choice.get("stop_reason"),
        server=server,
    )


def response_policy_version(body: Mapping[str, Any], headers: Mapping[str, str]) -> int | None:
    """The policy version the engine reports: body field `policy_version`, else header `x-policy-version`."""
    v = _int_or_none(body.get("policy_version"), "policy_version")
    if v is not None:
        return v
    raw = headers.get(POLICY_VERSION_HEADER)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise TokenContractError(f"header {POLICY_VERSION_HEADER}={raw!r} is not an integer") from None


def _int_or_none(v: Any, name: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TokenContractError(f"{name}={v!r} is not an integer")
    return v


def _completion_ids(choice: Mapping[str, Any], where: str) -> list[int]:
    """Completion ids from `token_ids`, cross-checked with `token_id:N` strings when the server sent them."""
    ids = choice.get("token_ids")
    from_strings = _ids_from_token_strings(choice, where)
    if ids is None:
        if from_strings is None:
            raise TokenContractError(
                f"{where}: no 'token_ids' and no 'token_id:N' logprob tokens; the server must honour "
                "return_token_ids (vLLM >= 0.10.2) or return_tokens_as_token_ids"
            )
        return from_strings
    check_ids(f"{where} token_ids", ids)
    if from_strings is not None and from_strings != ids:
        raise TokenContractError(f"{where}: token_ids {ids} disagree with logprob tokens {from_strings}")
    return list(ids)


def _ids_from_token_strings(choice: Mapping[str, Any], where: str) -> list[int] | None:
    lp = choice.get("logprobs")
    tokens = lp.get("tokens") if isinstance(lp, Mapping) else None
    if not isinstance(tokens, list) or not tokens:
        return None
    if not all(isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        return None  # the server rendered tokens as text (return_tokens_as_token_ids not honoured)
    try:
        return [int(t[len(TOKEN_ID_PREFIX):]) for t in tokens]
    except ValueError:
        raise TokenContractError(f"{where}: malformed token string in {tokens}") from None


def _token_logprobs(choice: Mapping[str, Any], where: str, n_ids: int) -> list[float]:
    lp = choice.get("logprobs")
    if not isinstance(lp, Mapping) or not isinstance(lp.get("token_logprobs"), list):
        raise TokenContractError(f"{where}: no logprobs.token_logprobs (request must set 'logprobs')")
    values = lp["token_logprobs"]
    if len(values) != n_ids:
        raise TokenContractError(f"{where}: {n_ids} completion ids but {len(values)} logprobs")
    tokens = lp.get("tokens")
    if isinstance(tokens, list) and len(tokens) != n_ids:
        raise TokenContractError(f"{where}: {n_ids} completion ids but {len(tokens)} logprob tokens")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TokenContractError(f"{where}: token_logprobs[{i}]={v!r} is not a number")
        out.append(float(v))
    return out


def _check_prompt_echo(
    choice: Mapping[str, Any], body: Mapping[str, Any], prompt_ids: list[int], where: str, required: bool
) -> None:
    echoed = choice.get("prompt_token_ids")
    if echoed is None:
        echoed = body.get("prompt_token_ids")
    if echoed is None:
        if required:
            raise TokenContractError(f"{where}: the server did not echo prompt_token_ids (return_token_ids)")
        return
    if list(echoed) != list(prompt_ids):
        n_same = next((i for i, (a, b) in enumerate(zip(echoed, prompt_ids)) if a != b), min(len(echoed), len(prompt_ids)))
        raise TokenContractError(
            f"{where}: echoed prompt_token_ids differ from the ids sent (lengths {len(echoed)} vs "
            f"{len(prompt_ids)}, first difference at position {n_same})"
        )
