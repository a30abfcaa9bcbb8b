"""End-to-end harness: a real local Kubernetes control plane (`e2e.cluster`) and test helpers."""
