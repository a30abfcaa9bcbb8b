"""The trainer's weight publication: which policy version inference serves, and when rollouts get it.

The initial weights (the base model's, or the checkpoint's on resume) are published by
:meth:`Publication.start`, which also keeps a restarted inference replica on the current version
(:class:`.inference_sync.InferenceSync`). After each step :meth:`Publication.serve` makes inference
serve the new version (:class:`.publisher.WeightPublisher`: saved, loaded, verified) and only then
grants it to rollouts (the coordinator's policy version). Under bounded staleness
(``rollout.maxStaleness`` S > 0) that runs in a thread while the next step trains
(:attr:`Publication.in_background`; ``$RFT_PUBLISH=inline`` keeps it in the step): the tasks
submitted meanwhile wait for it (``min_version``), so no episode is more than S versions older than
the policy that trains on it, as with an inline publication.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any, Callable

from rft_api.layout import published_weights_dir
from rft_api.progress import FinalModel, OutputPush
from rft_api.runtime import RuntimeConfig

from .inference_sync import InferenceSync
from .publisher import FINAL_DIR, BackgroundPublication, WeightPublisher, detached_state, export_final_model
from .reload import reload_protocol
from .replicas import InferenceReplicas

log = logging.getLogger(__name__)

# Where a step's weight publication runs under bounded staleness: "background" (the default: the next
# step trains meanwhile) or "inline" (the step waits for it, as a synchronous run always does).
PUBLISH_ENV = "RFT_PUBLISH"
PUBLISH_CHOICES = ("background", "inline")


class Publication:
    """Publishes the trainer's policy versions to inference and grants each to rollouts once served
    (``grant(version)``: the coordinator's policy version). :attr:`served_version` is the newest
    version inference serves (one behind the trainer's while a publication runs in the background)."""

    def __init__(self, cfg: RuntimeConfig, grant: Callable[[int], None]) -> None:
        self.cfg, self.spec = cfg, cfg.spec
        self._grant = grant
        self.served_version = 0
        self.waited_s: float | None = None  # how long the background publication last waited for ran
        self.publisher: WeightPublisher | None = None
        self._background = BackgroundPublication()
        self._sync: InferenceSync | None = None
        self._model: Any = None
        self._tokenizer: Any = None

    @property
    def syncs_weights(self) -> bool:
        """Whether inference gets the trainer's weights (``inference.weightSync`` is not ``none``)."""
        return self.spec.inference.weight_sync != "none"

    @functools.cached_property
    def in_background(self) -> bool:
        """Whether a step's publication runs in a thread while the next step trains: under bounded
        staleness (a synchronous run's next rollouts need the new weights at once), unless
        ``$RFT_PUBLISH`` is ``inline``."""
        where = os.environ.get(PUBLISH_ENV) or "background"
        if where not in PUBLISH_CHOICES:
            raise ValueError(f"{PUBLISH_ENV} must be one of {', '.join(PUBLISH_CHOICES)}, got {where!r}")
        return where == "background" and self.spec.rollout.max_staleness > 0 and self.syncs_weights

    def start(self, model: Any, tokenizer: Any, version: int, gather: Callable[[], dict[str, Any]]) -> None:
        """Make every inference replica serve ``version`` of ``model`` (the weights ``gather()`` returns; a
        replica that does not answer yet is retried as every publication is) and keep a restarted one on
        the version served."""
        cfg, inf = self.cfg, self.spec.inference
        replicas = InferenceReplicas(cfg.endpoints.inference, cfg.endpoints.inference_replicas)
        self.publisher = WeightPublisher(published_weights_dir(cfg.paths.checkpoints), replicas,
                                         keep=self.spec.rollout.policy_versions_served(),
                                         protocol=reload_protocol(inf.engine, inf.weight_sync, cfg.endpoints.served_model_name,
                                                                   cfg.trainer.weight_transfer or "path"))
        self._model, self._tokenizer = model, tokenizer
        if self.syncs_weights:
            self.publisher.publish(model, version, tokenizer, state_dict=gather())
            # a restarted inference server comes back with the base weights: bring it to the current ones
            self._sync = InferenceSync(self.publisher, lambda: self.served_version).start()
        self.served_version = version
        _ = self.in_background  # a bad $RFT_PUBLISH is refused now, not after the first step

    def serve(self, version: int, state: dict[str, Any] | None) -> None:
        """Make inference serve ``state`` (the gathered weights; None where inference gets none) as
        ``version`` (verified), then grant it to rollouts; call :meth:`wait` first.

        In the background (:attr:`in_background`): ``state`` is copied now (the next step's optimiser
        changes the weights in place), written and loaded in a thread while the next step trains. At
        most one runs, so versions are served in order; an error of the publication is raised by the
        next :meth:`wait`."""
        if state is None:
            self.served_version = version
            self._grant(version)
        elif self.in_background:
            self._background.start(self._serve, version, detached_state(state, self._model))
        else:
            self._serve(version, state)

    def _serve(self, version: int, state: dict[str, Any]) -> None:
        """Publish ``state`` as ``version`` and grant it to rollouts (in the publication's thread when it
        runs in the background)."""
        assert self._sync is not None and self.publisher is not None
        with self._sync.lock:  # never re-synced to a version that is being replaced
            self.publisher.publish(self._model, version, self._tokenizer, state_dict=state)
            self.served_version = version
        self._grant(version)

    def wait(self) -> None:
        """Wait for the publication running in the background (its error raised here); how long it ran
        is :attr:`waited_s`."""
        if self._background.running:
            self.waited_s = self._background.wait()

    def stop(self) -> None:
        """Wait for the publication running in the background, logging its error (not raising it), and
        end its thread."""
        self._background.close()

    def close(self) -> None:
        """:meth:`stop`, and stop keeping restarted replicas on the version served."""
        self._background.close()
        if self._sync is not None:
            self._sync.stop()
            self._sync = None


def export_final(model: Any, tokenizer: Any, state: dict[str, Any], cfg: RuntimeConfig,
                 model_dir: str | Path) -> FinalModel:
    """Write the trained policy (``state``) under ``final/`` on the checkpoint volume, so that it
    outlives the job (:func:`.publisher.export_final_model`; a LoRA adapter merged into the base model
    too when ``checkpoint.mergeFinalAdapter``)."""
    fmt, merged = export_final_model(model, Path(cfg.paths.checkpoints), tokenizer, state_dict=state,
                                     base_model_dir=model_dir, merge_adapter=cfg.spec.checkpoint.merge_final_adapter)
    log.info("final model (%s) at %s", fmt, Path(cfg.paths.checkpoints) / FINAL_DIR)
    return FinalModel(path=FINAL_DIR, format=fmt, merged_path=merged)


def push_final(cfg: RuntimeConfig, final: FinalModel) -> OutputPush | None:
    """Push the final model to ``spec.output`` (None without it). A failed push is reported, not
    raised: the model stays on the checkpoint volume and the job says where it is and why the push
    failed (condition OutputPushed)."""
    out = cfg.spec.output
    if out is None:
        return None
    from ..storage.errors import StorageError
    from ..storage.push import push_dir

    src = Path(cfg.paths.checkpoints) / (final.merged_path or final.path)
    try:
        rec = push_dir(src, out, cfg.spec.storage, sub="final", message=f"rft: {cfg.job.name}: final model")
    except StorageError as e:
        log.error("pushing the final model failed (it stays at %s): %s", src, e)
        return OutputPush(uri=out.uri, error=str(e)[:1024], reason=e.reason)
    log.info("final model pushed to %s (%d files, %d uploaded)", rec.uri, rec.files, rec.uploaded)
    return OutputPush(uri=rec.uri, revision=rec.revision, files=rec.files, bytes=rec.bytes)
