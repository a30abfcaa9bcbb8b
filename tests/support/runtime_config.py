"""Building the runtime contract (``rft_api.runtime``) for roles started by tests on loopback."""

from __future__ import annotations

from pathlib import Path

from rft_api import runtime
from rft_api.job import RFTJob
from rft_api.spec import RFTJobSpec


def local_config(name: str, spec: RFTJobSpec, *, inference: list[str], checkpoints: Path, output: Path,
                 coordinator_port: int = 0, reward: str | None = None, model_cache: Path | None = None,
                 threads: int | None = 1) -> runtime.RuntimeConfig:
    """A job's runtime config with every server on 127.0.0.1 and progress written to ``output``."""
    job = RFTJob(metadata={"name": name, "namespace": "default"}, spec=spec)
    return runtime.build(
        job,
        endpoints=runtime.Endpoints(inference=inference, served_model_name=name, reward=reward,
                                    coordinator=f"http://127.0.0.1:{coordinator_port}"),
        ports=runtime.Ports(coordinator=coordinator_port),
        paths=runtime.spec_paths(spec, checkpoints=str(checkpoints), model_cache=str(model_cache) if model_cache
                                 else None, output=str(output)),
        scoring="reward" if reward else "rollout",
        progress=runtime.ProgressTarget(sink="file"),
        trainer=runtime.TrainerSettings(threads=threads),
    )


def with_coordinator(cfg: runtime.RuntimeConfig, url: str) -> runtime.RuntimeConfig:
    """``cfg`` with the coordinator URL the trainer reported (after it bound port 0)."""
    return cfg.model_copy(update={"endpoints": cfg.endpoints.model_copy(update={"coordinator": url})})
