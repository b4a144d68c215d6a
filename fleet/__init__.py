"""The shared kernel: configuration, the store, the worker control contract and metric names."""
