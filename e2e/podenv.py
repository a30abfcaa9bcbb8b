"""What a kubelet puts in a container's environment (process kubelet, TEST INFRASTRUCTURE).

- :func:`expand`: Kubernetes ``$(VAR)`` expansion (``$$`` escapes a ``$``; an undefined reference and
  an unterminated ``$(`` are left as written).
- :func:`container_env`: ``envFrom`` then ``env`` in order (each value expanded against the variables
  defined before it and the service variables), ``valueFrom`` (``fieldRef``, ``resourceFieldRef``,
  ``secretKeyRef``, ``configMapKeyRef``, optional references), and ``KUBERNETES_SERVICE_*`` pointing
  at the API server. Service links of other Services are not injected (their cluster IPs do not route
  here; Service names resolve through the pod's hosts file instead).
- :func:`field_value` / :func:`resource_value`: the downward API, shared with ``downwardAPI`` volumes.

Objects are plain dicts as the API server returns them (camelCase keys). Fetching ConfigMaps and
Secrets is the caller's: ``get_object(kind, namespace, name)`` returns the dict or ``None`` (404).
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

Obj = dict[str, Any]
GetObject = Callable[[str, str, str], "Obj | None"]


class EnvError(Exception):
    """A container's environment cannot be built; the message names the variable and the reason
    (reported as ``CreateContainerConfigError``)."""


# ------------------------------------------------------------------------------------ $(VAR)


def expand(text: str, mapping: Mapping[str, str]) -> str:
    """Expand ``$(NAME)`` references in ``text`` the way Kubernetes does for env, command and args."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c != "$" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":  # escaped dollar
            out.append("$")
            i += 2
        elif nxt == "(":
            close = text.find(")", i + 2)
            if close < 0:  # unterminated: keep "$(" and carry on after it
                out.append("$(")
                i += 2
            else:
                name = text[i + 2:close]
                out.append(mapping[name] if name in mapping else f"$({name})")
                i = close + 1
        else:
            out.append("$" + nxt)
            i += 2
    return "".join(out)


# ------------------------------------------------------------------------------------ quantities

_SUFFIX = {
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)$")


def parse_quantity(q: str | int | float) -> Fraction:
    """A Kubernetes resource quantity (``500m``, ``2Gi``, ``1e3``) as an exact fraction."""
    if isinstance(q, (int, float)):
        return Fraction(q)
    m = _QUANTITY.match(str(q).strip())
    if not m:
        raise ValueError(f"not a resource quantity: {q!r}")
    number, exp, suffix = m.groups()
    value = Fraction(number)
    if exp:
        return value * Fraction(10) ** int(exp[1:])
    return value * _SUFFIX[suffix or ""]


# ------------------------------------------------------------------------------------ downward API

_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def _format_map(m: Mapping[str, str]) -> str:
    """``key="value"`` lines, sorted, as the downward API writes labels and annotations files."""
    def quote(v: str) -> str:
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return "\n".join(f"{k}={quote(v)}" for k, v in sorted(m.items()))


def field_value(pod: Obj, path: str, *, pod_ip: str | None, host_ip: str) -> str:
    """Value of a downward-API ``fieldRef.fieldPath`` for ``pod``."""
    meta, spec = pod.get("metadata", {}), pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "metadata.labels": _format_map(meta.get("labels") or {}),
        "metadata.annotations": _format_map(meta.get("annotations") or {}),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
        "status.podIP": pod_ip or "",
        "status.podIPs": pod_ip or "",
    }
    if path in simple:
        return simple[path]
    m = _SUBSCRIPT.match(path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    raise EnvError(f"fieldRef.fieldPath {path!r} is not supported")


def _find_container(pod: Obj, name: str) -> Obj:
    spec = pod.get("spec", {})
    for c in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        if c.get("name") == name:
            return c
    raise EnvError(f"resourceFieldRef.containerName {name!r}: no such container")


def resource_value(container: Obj, ref: Obj, allocatable: Mapping[str, str]) -> str:
    """Value of a ``resourceFieldRef`` (``limits.cpu``, ``requests.memory``, ...) for ``container``.

    An unset limit is the node's allocatable amount, an unset request is the limit when there is one
    (as the API server defaults it) else 0; the result is rounded up in units of ``divisor``.
    """
    resource = ref.get("resource", "")
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or not name:
        raise EnvError(f"resourceFieldRef.resource {resource!r} is not supported")
    res = container.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    if kind == "limits":
        raw = limits.get(name, allocatable.get(name, "0"))
    else:
        raw = requests.get(name, limits.get(name, "0"))
    divisor = parse_quantity(ref.get("divisor") or "1")
    if divisor <= 0:
        raise EnvError(f"resourceFieldRef.divisor {ref.get('divisor')!r} must be positive")
    return str(math.ceil(parse_quantity(raw) / divisor))


# ------------------------------------------------------------------------------------ env


def api_server_env(host: str, port: int) -> dict[str, str]:
    """The ``kubernetes`` Service variables every container gets, pointing at the API server."""
    addr = f"tcp://{host}:{port}"
    return {
        "KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": str(port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(port), "KUBERNETES_PORT": addr,
        f"KUBERNETES_PORT_{port}_TCP": addr, f"KUBERNETES_PORT_{port}_TCP_PROTO": "tcp",
        f"KUBERNETES_PORT_{port}_TCP_PORT": str(port), f"KUBERNETES_PORT_{port}_TCP_ADDR": host,
    }


def object_data(kind: str, obj: Obj) -> dict[str, bytes]:
    """The decoded data of a ConfigMap (``data`` + ``binaryData``) or a Secret (``data``)."""
    out: dict[str, bytes] = {}
    if kind == "ConfigMap":
        out.update({k: v.encode() for k, v in (obj.get("data") or {}).items()})
        out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    else:
        out.update({k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()})
        out.update({k: v.encode() for k, v in (obj.get("stringData") or {}).items()})
    return out


def _key_ref(kind: str, ref: Obj, namespace: str, get_object: GetObject, var: str) -> str | None:
    name, key, optional = ref.get("name", ""), ref.get("key", ""), bool(ref.get("optional"))
    obj = get_object(kind, namespace, name)
    if obj is None:
        if optional:
            return None
        raise EnvError(f"env {var}: {kind.lower()} {namespace}/{name} not found")
    data = object_data(kind, obj)
    if key not in data:
        if optional:
            return None
        raise EnvError(f"env {var}: key {key!r} not found in {kind.lower()} {namespace}/{name}")
    return data[key].decode(errors="replace")


def _env_from(sources: list[Obj], namespace: str, get_object: GetObject) -> dict[str, str]:
    out: dict[str, str] = {}
    for src in sources:
        prefix = src.get("prefix", "")
        for field, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret")):
            ref = src.get(field)
            if ref is None:
                continue
            obj = get_object(kind, namespace, ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f"envFrom: {kind.lower()} {namespace}/{ref.get('name')} not found")
            for k, v in object_data(kind, obj).items():
                name = prefix + k
                if name and "=" not in name:  # the API server's relaxed env-name rule
                    out[name] = v.decode(errors="replace")
    return out


def container_env(pod: Obj, container: Obj, *, pod_ip: str | None, host_ip: str, service_env: Mapping[str, str],
                  get_object: GetObject, allocatable: Mapping[str, str]) -> dict[str, str]:
    """The Kubernetes-defined environment of ``container`` (without the image's own ENV).

    Raises :class:`EnvError` naming the variable when a required reference cannot be resolved.
    """
    namespace = pod["metadata"]["namespace"]
    env = _env_from(container.get("envFrom") or [], namespace, get_object)
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value") or "", {**service_env, **env})
            continue
        vf = var["valueFrom"]
        value: str | None
        if "fieldRef" in vf:
            value = field_value(pod, vf["fieldRef"].get("fieldPath", ""), pod_ip=pod_ip, host_ip=host_ip)
        elif "resourceFieldRef" in vf:
            ref = vf["resourceFieldRef"]
            target = _find_container(pod, ref["containerName"]) if ref.get("containerName") else container
            value = resource_value(target, ref, allocatable)
        elif "secretKeyRef" in vf:
            value = _key_ref("Secret", vf["secretKeyRef"], namespace, get_object, name)
        elif "configMapKeyRef" in vf:
            value = _key_ref("ConfigMap", vf["configMapKeyRef"], namespace, get_object, name)
        else:
            raise EnvError(f"env {name}: valueFrom {sorted(vf)} is not supported")
        if value is not None:
            env[name] = value
    return {**service_env, **env}


def command_line(container: Obj, env: Mapping[str, str]) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expanded against ``env`` (images have no entrypoint here)."""
    return [expand(str(a), env) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
