"""`python -m gpuportal`, the same as the `gpuportal` command."""

from gpuportal.main import main

main()
