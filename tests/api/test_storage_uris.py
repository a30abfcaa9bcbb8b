"""The storage URI grammar (hf://, hf://datasets/, s3://, pvc://) and the spec fields that take it:
what parses, and what is refused with a message naming the field and the part that is wrong."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from rft_api import layout
from rft_api.job import InvalidSpec, parse_manifest
from rft_api.spec import DataSource, ModelSpec, OutputSpec, S3Storage
from rft_api.storage import ClaimUri, HubUri, S3Uri, UriError, parse_uri


@pytest.mark.parametrize("text,parsed", [
    ("hf://HuggingFaceTB/SmolLM2-135M-Instruct", HubUri("HuggingFaceTB/SmolLM2-135M-Instruct", "model")),
    ("hf://gpt2@refs-pr-1", HubUri("gpt2", "model", "refs-pr-1")),
    ("hf://datasets/openai/gsm8k@main", HubUri("openai/gsm8k", "dataset", "main")),
    ("hf://org/name@0123456789abcdef0123456789abcdef01234567",
     HubUri("org/name", "model", "0123456789abcdef0123456789abcdef01234567")),
    ("s3://my-bucket", S3Uri("my-bucket", "")),
    ("s3://my-bucket/models/smollm2/", S3Uri("my-bucket", "models/smollm2/")),
    ("s3://my.bucket/a//b", S3Uri("my.bucket", "a/b")),
    ("pvc://models/smollm2", ClaimUri("models", "smollm2")),
])
def test_uris_parse_and_print_back(text, parsed):
    assert parse_uri(text) == parsed
    assert parse_uri(str(parsed)) == parsed


@pytest.mark.parametrize("text,words", [
    ("gs://bucket/x", "unknown storage scheme"),
    ("hf://", "nothing after hf://"),
    ("hf://a/b/c", "hf://[datasets/]ORG/NAME"),
    ("hf://org/name@", "revision"),
    ("hf://org/name@bad revision", "revision"),
    ("s3://UPPER/x", "bucket name"),
    ("s3://ok-bucket/../etc", "'..'"),
    ("pvc://Claim_1/x", "PersistentVolumeClaim"),
])
def test_malformed_uris_say_what_is_wrong(text, words):
    with pytest.raises(UriError) as err:
        parse_uri(text)
    assert words in str(err.value) and text in str(err.value)


def test_model_base_takes_model_uris_and_refuses_others_naming_the_field():
    assert ModelSpec(base="hf://org/m").base == "hf://org/m"
    for bad, words in [("hf://datasets/org/d", "a model repository"), ("ftp://x/y", "unknown storage scheme")]:
        with pytest.raises(ValidationError) as err:
            ModelSpec(base=bad)
        assert words in str(err.value)
    with pytest.raises(ValidationError) as err:
        ModelSpec(base="s3://bucket/m", volume={"claimName": "c"})
    assert "model.volume cannot be combined" in str(err.value)


def test_a_data_source_takes_one_of_its_kinds_and_dataset_uris_only():
    assert DataSource(uri="hf://datasets/openai/gsm8k", split="test", config="main").config == "main"
    with pytest.raises(ValidationError, match="exactly one of builtin, configMapKeyRef, path or uri"):
        DataSource(uri="s3://b/x.jsonl", path="/data/x.jsonl")
    with pytest.raises(ValidationError, match="hf://datasets/ORG/NAME"):
        DataSource(uri="hf://org/model")
    with pytest.raises(ValidationError, match="fields and format apply to files"):
        DataSource(builtin="arithmetic", fields={"prompt": "q"})
    with pytest.raises(ValidationError, match="fields.prompt and fields.messages"):
        DataSource(uri="s3://b/x.jsonl", fields={"prompt": "q", "messages": "m"})


def test_output_and_storage_fields():
    assert OutputSpec(uri="hf://org/trained@run-1").private
    with pytest.raises(ValidationError, match="output.uri must be"):
        OutputSpec(uri="pvc://claim/out")
    with pytest.raises(ValidationError, match="set both accessKeyIdSecretRef and secretAccessKeySecretRef"):
        S3Storage(accessKeyIdSecretRef={"name": "s", "key": "id"})
    with pytest.raises(ValidationError):
        S3Storage(endpoint="http://user:pass@host:9000")  # credentials in the endpoint are refused


def _job(**spec):
    base = {"model": {"base": "builtin:tiny"}, "dataset": {"train": {"builtin": "arithmetic"}},
            "evaluator": {"builtin": "math"}}
    return {"apiVersion": "rft.dev/v1alpha1", "kind": "RFTJob", "metadata": {"name": "j"}, "spec": {**base, **spec}}


def test_a_manifest_error_names_the_full_field_path():
    with pytest.raises(InvalidSpec) as err:
        parse_manifest(_job(dataset={"train": {"uri": "s3://Bad/x"}}))
    assert "spec.dataset.train" in str(err.value) and "bucket name" in str(err.value)


def test_layout_fetches_each_uri_once_and_reads_claims_in_place():
    job = parse_manifest(_job(model={"base": "hf://org/m"}, dataset={
        "train": {"uri": "hf://datasets/org/d", "split": "train"},
        "eval": {"uri": "hf://datasets/org/d", "split": "test"},
        "mix": None}))
    found = layout.inputs(job.spec, "/checkpoints/inputs")
    assert [(i.field, i.kind) for i in found] == [("spec.model.base", "model"), ("spec.dataset.train.uri", "dataset")]
    assert layout.dataset_path("eval", job.spec.dataset.eval) == layout.dataset_path("train", job.spec.dataset.train)
    claim = parse_manifest(_job(model={"base": "pvc://models/smollm2"}))
    assert layout.inputs(claim.spec, "/x") == [] and layout.model_path(claim.spec) == "/mnt/claims/models/smollm2"
    assert layout.claims(claim.spec) == ["models"]
