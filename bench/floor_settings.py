"""Settings of the floor's gunicorn (bench/floor_views.py): the portal's, with the floor's URLs."""

from portal.settings import *  # noqa: F403  (everything the portal's processes read)

ROOT_URLCONF = "bench.floor_views"
