"""gpuportal: a command line client of the GPU portal's REST API (docs/cli.md)."""

__version__ = "0.1.0"
