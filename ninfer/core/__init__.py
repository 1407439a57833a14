"""Layer 1: devices, dtypes, buffers, paged pools, graphs, transfers. Imports nothing from ninfer."""
