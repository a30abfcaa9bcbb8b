"""Checks on the project's Dockerfiles: hadolint's findings, pinned base images, a non-root final USER.

Pure functions over Dockerfile text (plus one that runs hadolint), so each check can be pointed at any
Dockerfile, including a deliberately bad one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

FAILING_LEVELS = ("error", "warning")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction: its upper-cased keyword, its argument text and its first line."""

    keyword: str
    args: str
    line: int


def parse_instructions(text: str) -> list[Instruction]:
    """Split Dockerfile text into instructions, joining `\\` continuations and dropping comments."""
    out: list[Instruction] = []
    parts: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue  # blank and comment lines, also inside a continuation (as Docker does)
        if not parts:
            start = number
        continues = stripped.endswith("\\")
        parts.append(stripped[:-1].strip() if continues else stripped)
        if not continues:
            joined = " ".join(p for p in parts if p)
            keyword, _, args = joined.partition(" ")
            out.append(Instruction(keyword.upper(), args.strip(), start))
            parts = []
    if parts:
        joined = " ".join(p for p in parts if p)
        keyword, _, args = joined.partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
    return out


def _from_image_and_stage(args: str) -> tuple[str, str | None]:
    """The image reference and the optional `AS name` of a FROM's arguments (flags skipped)."""
    tokens = [t for t in args.split() if not t.startswith("--")]
    if not tokens:
        return "", None
    stage = tokens[2].lower() if len(tokens) >= 3 and tokens[1].lower() == "as" else None
    return tokens[0], stage


def _substitute(image: str, args: dict[str, str]) -> str:
    """Expand `$NAME`, `${NAME}` and `${NAME:-default}` from the global ARG defaults; unknown stay."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in args:
            return args[name]
        if m.group(2) is not None:
            return m.group(2)
        return m.group(0)

    return _VAR.sub(repl, image)


def base_image_problems(text: str) -> list[str]:
    """Problems with each FROM: a `:latest` tag, no tag and no digest, or a reference not resolvable.

    References to earlier stages (`FROM build`) and `scratch` are fine; `ARG` defaults declared before
    the first FROM are substituted, as Docker does.
    """
    problems: list[str] = []
    global_args: dict[str, str] = {}
    stages: set[str] = set()
    seen_from = False
    for ins in parse_instructions(text):
        if ins.keyword == "ARG" and not seen_from:
            name, eq, default = ins.args.partition("=")
            if eq:
                global_args[name.strip()] = default.strip().strip('"').strip("'")
            continue
        if ins.keyword != "FROM":
            continue
        seen_from = True
        raw, stage = _from_image_and_stage(ins.args)
        image = _substitute(raw, global_args)
        where = f"line {ins.line}: FROM {ins.args}"
        if not image:
            problems.append(f"{where}: no image named")
        elif "$" in image:
            problems.append(f"{where}: cannot resolve {raw!r} from the global ARG defaults")
        elif image.lower() == "scratch" or image.lower() in stages:
            pass
        else:
            name, _, digest = image.partition("@")
            last = name.rsplit("/", 1)[-1]  # a registry's host:port comes before the last '/'
            tag = last.partition(":")[2]
            if tag.lower() == "latest":
                problems.append(f"{where}: uses the ':latest' tag; pin a release tag")
            elif not tag and not digest:
                problems.append(f"{where}: untagged base image {image!r}; pin a release tag")
        if stage:
            stages.add(stage)
    return problems


def final_stage_user(text: str) -> str | None:
    """The last USER set in the final stage (after the last FROM), or None when it sets none."""
    user: str | None = None
    for ins in parse_instructions(text):
        if ins.keyword == "FROM":
            user = None
        elif ins.keyword == "USER":
            user = ins.args.strip()
    return user


def is_non_root(user: str | None) -> bool:
    """Whether a USER value (`name`, `uid`, `uid:gid`) is a literal user other than root/uid 0."""
    if not user or "$" in user:
        return False
    name = user.split(":", 1)[0].strip()
    return bool(name) and name.lower() != "root" and name.lstrip("0") != ""


def hadolint_findings(hadolint: str, dockerfile: Path, config: Path, cwd: Path) -> list[dict]:
    """Run hadolint with `--format json` on one Dockerfile and return its findings (all levels).

    `config` is passed explicitly so a user's global hadolint config cannot change the result, and
    HADOLINT_* variables are removed from the environment for the same reason.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADOLINT_")}
    proc = subprocess.run(
        [hadolint, "--config", str(config), "--format", "json", "--no-fail", str(dockerfile)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"hadolint exited {proc.returncode} on {dockerfile}:\n{proc.stdout}\n{proc.stderr}"
        )
    try:
        findings = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"hadolint printed no JSON for {dockerfile}: {proc.stdout!r}") from exc
    if not isinstance(findings, list):
        raise RuntimeError(f"hadolint's JSON for {dockerfile} is not a list: {findings!r}")
    return findings


def failing(findings: list[dict]) -> list[dict]:
    """The findings at a level that fails the lint (error or warning)."""
    return [f for f in findings if f.get("level") in FAILING_LEVELS]


def format_findings(findings: list[dict]) -> str:
    """One line per finding: `file:line CODE level: message`."""
    return "\n".join(
        f"{f.get('file')}:{f.get('line')} {f.get('code')} {f.get('level')}: {f.get('message')}"
        for f in findings
    )
