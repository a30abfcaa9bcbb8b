"""rft_api: the RFTJob API (pydantic models, validation, CRD generation). No torch, no Kubernetes client."""
from .constants import API_VERSION, GROUP, KIND, PLURAL, VERSION
from .job import InvalidSpec, RFTJob, load_manifest, parse_manifest, validate_spec
from .presets import ALGORITHM_PRESETS, ResolvedAlgorithm, resolve_algorithm
from .spec import RFTJobSpec
from .status import RFTJobStatus

__all__ = [
    "API_VERSION", "GROUP", "KIND", "PLURAL", "VERSION", "InvalidSpec", "RFTJob", "load_manifest",
    "parse_manifest", "validate_spec", "ALGORITHM_PRESETS", "ResolvedAlgorithm", "resolve_algorithm",
    "RFTJobSpec", "RFTJobStatus",
]
