"""Who is a platform admin. Helper branch `roles` makes this the one definition the API, the
pages and the console share; until it lands, this stand-in (same module, same name) is it."""

from django.contrib.auth.models import AbstractBaseUser


def is_platform_admin(user: AbstractBaseUser) -> bool:
    """An explicit grant (the tenants.platform_admin permission) or a superuser; is_staff alone
    is not one."""
    if not (user.is_authenticated and user.is_active):
        return False
    return user.is_superuser or user.has_perm("tenants.platform_admin")
