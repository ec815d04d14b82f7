"""Model fields whose values the database holds encrypted, with keys it never holds.

settings.FIELD_ENCRYPTION_KEY is a list of Fernet keys (AES-128-CBC with HMAC-SHA256,
cryptography's MultiFernet): the first encrypts, every one decrypts, so that a key is rotated
by putting a new one first, running `manage.py rotate_field_key` and then dropping the old one.
A value is decrypted when a row is read and encrypted when it is written; in between the model
holds plaintext, in memory only. Lookups on these fields match nothing but the empty value,
since the same text encrypts differently each time.
"""

from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models


class FieldKeyMissing(ImproperlyConfigured):
    """A stored value was encrypted with a key that FIELD_ENCRYPTION_KEY no longer lists."""


@lru_cache(maxsize=4)
def _fernet_of(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(key) for key in keys])


def field_fernet() -> MultiFernet:
    """The keys now configured (a test's override_settings included)."""
    return _fernet_of(tuple(settings.FIELD_ENCRYPTION_KEY))


def encrypt_text(text: str) -> str:
    """The Fernet token of `text` under the first key; the empty text stays empty."""
    return field_fernet().encrypt(text.encode()).decode() if text else text


def decrypt_text(token: str) -> str:
    """`token` decrypted by whichever configured key made it; the empty text stays empty."""
    if not token:
        return token
    return _decrypted(tuple(settings.FIELD_ENCRYPTION_KEY), token)


# A list of 50 jobs joined to their cluster reads the same token 50 times: decrypting a 3.4 kB
# RSA key cost 27 us here (an ed25519 key 10 us), a hit 1.6 us. The process holds the keys that decrypt every
# token anyway, so keeping a few plaintexts beside them exposes nothing more.
@lru_cache(maxsize=64)
def _decrypted(keys: tuple[str, ...], token: str) -> str:
    try:
        return _fernet_of(keys).decrypt(token.encode()).decode()
    except InvalidToken:
        raise FieldKeyMissing(
            "An encrypted field cannot be decrypted with any key of FIELD_ENCRYPTION_KEY: "
            "the key it was written with is missing, or the value was changed in the database."
        ) from None


class EncryptedTextField(models.TextField):
    """Text stored as a Fernet token (urlsafe base64, about 4/3 of the text plus 60 characters).
    The empty value is stored empty, so that "is it set?" needs no key."""

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        return value if value is None else encrypt_text(value)

    def from_db_value(self, value, expression, connection):
        return value if value is None else decrypt_text(value)
