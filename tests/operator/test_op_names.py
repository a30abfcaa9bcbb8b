"""Child names are deterministic and valid DNS-1035 labels for the longest allowed job name."""
from __future__ import annotations

import pytest

from rft_api.job import MAX_NAME_LENGTH, InvalidSpec, validate_name
from rft_operator import names


def test_longest_job_name_gives_valid_child_names() -> None:
    job = "a" + "b-" * ((MAX_NAME_LENGTH - 2) // 2) + "c"
    job = job[:MAX_NAME_LENGTH - 1] + "z"
    assert len(job) == MAX_NAME_LENGTH
    validate_name(job)
    for n in names.all_names(job):
        assert len(n) <= 63, n
        assert names.DNS1035.match(n), n
    # an Indexed Job pod's hostname is "<job name>-<index>": a DNS label too (up to 1024 nodes)
    assert len(names.trainer(job)) + len("-1023") <= 63


def test_names_are_deterministic_and_distinct() -> None:
    assert names.all_names("x") == names.all_names("x")
    assert len(set(names.all_names("x"))) == len(names.all_names("x"))
    assert names.config("job") == "job-config" and names.progress("job") == "job-progress"
    assert names.inference("job") == "job-inference" and names.reward("job") == "job-reward"
    assert names.rollout("job") == "job-rollout" and names.trainer("job") == "job-trainer"
    assert names.checkpoints("job") == "job-checkpoints"


def test_a_longer_name_is_refused_by_the_api() -> None:
    with pytest.raises(InvalidSpec, match="metadata.name"):
        validate_name("a" * (MAX_NAME_LENGTH + 1))


def test_labels_and_selectors() -> None:
    assert names.labels("j", "rollout") == {
        "app.kubernetes.io/name": "rft", "app.kubernetes.io/instance": "j", "rft.dev/role": "rollout",
        "app.kubernetes.io/managed-by": "rft-operator"}
    assert names.selector("j", "rollout").items() <= names.labels("j", "rollout").items()
    assert names.job_selector("j") == "app.kubernetes.io/instance=j,app.kubernetes.io/managed-by=rft-operator"
