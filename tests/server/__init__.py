"""End-to-end and in-process tests of the HTTP server (ninfer/serve)."""
