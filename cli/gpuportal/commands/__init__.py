"""The commands of `gpuportal`, one module per subject; each registers its commands on app.app."""
