"""The ASGI entry point: the event streams' server (jobs/stream.py; docs/architecture.md, Live
events). In production nginx sends the stream paths here and everything else to gunicorn's WSGI
workers (portal/wsgi.py); `make run` serves the whole portal through it."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

application = get_asgi_application()
