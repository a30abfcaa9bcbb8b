"""The fault tests on the real node (``e2e/node.py``): pods deleted, processes SIGKILLed (from this
machine's /proc, as the OOM killer would), the operator killed and restarted, suspend and resume,
with every pod running from the project's images under the builders' securityContext."""

from __future__ import annotations

import pytest

from tests.e2e.stack import driver  # noqa: F401 (fixture)
from tests.e2e.test_faults import (  # noqa: F401 (collected here too, on the real node)
    test_evaluator_raising_on_every_sample_fails_the_job,
    test_hanging_evaluator_times_out_per_sample_and_job_completes,
    test_inference_pod_deleted_new_pod_serves_current_weights,
)

# Not yet here: test_trainer_pod_deleted_resumes_from_latest_checkpoint,
# test_operator_killed_and_restarted_keeps_one_of_each_child and
# test_suspend_removes_pods_keeps_volume_and_resume_continues. Their jobs behave on the real node (the
# operator-kill job reached Succeeded at step 120), but they read each trainer attempt's log from the
# process kubelet's log files (test_faults.trainer_attempt_logs); a real kubelet removes a deleted
# pod's logs with the pod, so the harness must keep each attempt's log (kubectl logs) before it goes.

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]


@pytest.fixture(scope="module")
def platform(real_platform):
    """The fault tests' ``platform``, on the real node."""
    return real_platform
