from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from portal.core.models import ApiToken


def tokens_of(*, user: AbstractBaseUser) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user).only(
        "id", "name", "scope", "created", "expires", "last_used", "user_id"
    )
