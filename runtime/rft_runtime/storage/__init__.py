"""Remote storage for models and data: object stores (S3 and S3-compatible servers) and the Hugging Face
Hub, the errors they raise (:mod:`rft_runtime.storage.errors`), and fetching into and pushing from
local directories."""
