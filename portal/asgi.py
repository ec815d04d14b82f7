"""The ASGI entry point: the event streams' server (jobs/stream.py; docs/architecture.md, Live
events). In production nginx sends the stream paths here and everything else to gunicorn's WSGI
workers (portal/wsgi.py); `make run` serves the whole portal through it."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
# Under ASGI Django runs each request's sync code in a thread of its own, and a connection is
# per thread: 500 watchers opening at once were 500 connections and PostgreSQL refused them past
# its max_connections (bench/stream.py). Here connections come from a pool of DB_POOL_MAX per
# process (on PostgreSQL), none is kept past its request (Django's docs: no persistent
# connections under ASGI), and jobs/stream.py hands the request's back before a stream starts.
os.environ.setdefault("DB_POOL_MAX", "8")
os.environ.setdefault("DB_CONN_MAX_AGE", "0")

application = get_asgi_application()
