"""Django's ModelBackend without passwords: users' and groups' permissions as before, while the
portal's own passwords are off (LOCAL_LOGIN=false, portal/settings/identity.py)."""

from django.contrib.auth.backends import ModelBackend


class PermissionsOnlyBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        return None
