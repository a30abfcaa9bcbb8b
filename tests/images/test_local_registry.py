"""The local OCI registry the image tests push to (``e2e/registry.py``: distribution's ``registry``
built by ``hack/registry.sh``): it answers only the users of its htpasswd file (bcrypt, from the helper
built beside it), and a pull secret made for it names its address."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from e2e.registry import LocalRegistry, registry_binary
from tests.support import prereqs

# Built (or a background hack/prepare.sh waited for) before this test, outside its timeout.
_REGISTRY = prereqs.register("registry (hack/registry.sh)", rank=3, wanted=prereqs.uses_fixture("registry_exe"),
                             build=registry_binary)


@pytest.fixture
def registry_exe() -> Path:
    return _REGISTRY.get()


def test_the_registry_admits_its_user_and_refuses_anyone_else(tmp_path: Path, registry_exe: Path) -> None:
    with LocalRegistry(tmp_path, users={"alice": "right horse", "bob": "b0b"}) as reg:
        assert reg.status("/v2/") == 401  # anonymous
        assert reg.status("/v2/", "alice", "right horse") == 200
        assert reg.status("/v2/", "bob", "b0b") == 200
        assert reg.status("/v2/", "alice", "wrong") == 401
        assert reg.status("/v2/", "mallory", "right horse") == 401
        status, _, body = reg.request("/v2/_catalog", "alice", "right horse")
        assert status == 200 and json.loads(body) == {"repositories": []}
        cfg = json.loads(reg.dockerconfigjson("alice", "right horse"))["auths"][reg.address]
        assert base64.b64decode(cfg["auth"]).decode() == "alice:right horse"
    assert reg.status("/v2/") == 0  # stopped
    htpasswd = (tmp_path / "htpasswd").read_text().splitlines()
    assert [line.split(":", 1)[0] for line in htpasswd] == ["alice", "bob"]
    assert all(line.split(":", 1)[1].startswith("$2a$10$") for line in htpasswd)  # bcrypt, no password in clear
