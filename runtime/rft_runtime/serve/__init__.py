"""Builtin inference server: a vLLM-compatible OpenAI server on torch.

``rft serve --model DIR`` (:func:`rft_runtime.serve.server.main`) loads a Hugging Face causal LM
(Qwen2 family and alike, full attention) with transformers and serves, with vLLM 0.32's request
fields, response shapes and error bodies: ``/v1/completions``, ``/v1/chat/completions`` (both also
streamed as server-sent events with ``stream: true``, :mod:`rft_runtime.serve.stream`),
``/v1/models``, ``/health``, ``/tokenize``, ``/detokenize``, ``/metrics``; plus SGLang's
``/update_weights_from_disk`` and ``/get_policy_version``. In-process use:
:func:`rft_runtime.serve.server.create_app` over an :class:`rft_runtime.serve.engine.Engine`.

Choices (the contract's numerics):

* Logprobs of sampled tokens are *processed*, like vLLM's ``--logprobs-mode processed_logprobs``:
  ``log_softmax(filter(logits / T))`` where ``filter`` sets logits outside top-k / top-p to ``-inf``
  (rendered as -9999.0); temperature < 1e-5 is greedy and reports ``log_softmax(logits)``.
* ``prompt_logprobs`` (and echoed prompt logprobs) are raw ``log_softmax(logits)``: vLLM computes them
  before temperature in both of its modes (the recorded fixtures show identical values).
* Every sequence samples with noise hashed from (its seed, its token index); choice ``j`` of a request
  with ``seed`` uses ``seed + j`` (vLLM's rule), so a seeded request returns the same tokens alone or in
  any batch.
* Batching is continuous at the iteration level (:mod:`rft_runtime.serve.engine`): one forward pass per
  iteration carries every running decode and chunks of new prompts (:mod:`rft_runtime.serve.runner`);
  each sequence owns a slot of a preallocated KV cache (:mod:`rft_runtime.serve.kv_cache`); identical
  prompts admitted together (a request's n choices) are prefilled once. On a GPU, decode-only
  iterations replay CUDA graphs (:mod:`rft_runtime.serve.graphs`; ``--enforce-eager`` turns them off).
  A request runs under one policy version.
* Weight updates stop admitting new requests, wait at an iteration boundary for the running ones to
  finish, and swap all weights at once; responses carry
  ``policy_version`` (body) and ``x-policy-version`` (header). A LoRA adapter directory is merged
  into the weights the server started with, so successive adapters replace, never stack.
* ``/health`` answers 200 when a decode step succeeded in the last 2 s, or after generating a token.
"""
