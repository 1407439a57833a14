"""Layer 3: backend-neutral op entry points. Contracts: docs/ops.md."""
