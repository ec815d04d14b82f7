"""Settings, every one from the environment with a safe default (README: the table of settings),
one module per subject; DJANGO_SETTINGS_MODULE stays portal.settings. Later modules read what
earlier ones set (beat's schedule reads the intervals of jobs and identity)."""

from portal.settings.base import *  # noqa: F403
from portal.settings.billing import *  # noqa: F403
from portal.settings.celery import *  # noqa: F403
from portal.settings.identity import *  # noqa: F403
from portal.settings.jobs import *  # noqa: F403
from portal.settings.monitoring import *  # noqa: F403
from portal.settings.service import *  # noqa: F403
