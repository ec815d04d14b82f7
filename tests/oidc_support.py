"""A real OpenID Connect provider for tests: panva's oidc-provider (OpenID certified), npm's
package pinned in tests/oidc_provider/package-lock.json, run by tests/oidc_provider/server.mjs on a
free loopback port with a client, an RS256 key and users of the test's own.

`oidc_provider(folder, redirect_uri=…, post_logout_redirect_uri=…)` yields a running
`OidcProvider`: the authorization code flow with PKCE (S256, required), scopes openid profile
email groups, the claims (groups, uid among them) in the ID token and at userinfo, RP-initiated
logout whose page submits itself. Its login page is a form with `login` and `password` and a
"Sign in" button; consent is given without a page. The users live in a JSON file that the server
reads at every lookup: `set_user` and `remove_user` change it between two sign-ins.

`sign_jwt` makes an ID token as a provider would, for the tests of tokens a provider must not be
believed about (another key, expired, another audience)."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import secrets
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.conftest import ROOT, die_with_parent, free_port, stop
from tests.wait_support import wait_until

SERVER_DIR = ROOT / "tests" / "oidc_provider"
LOCK_FILE = SERVER_DIR / "package-lock.json"
# npm writes its own copy of the lock last in `npm ci`: older than the lock means a stale install.
INSTALLED = SERVER_DIR / "node_modules" / ".package-lock.json"
NPM_TIMEOUT_S = 300
START_TIMEOUT_S = 20
HTTP_TIMEOUT_S = 5
CLIENT_ID = "gpu-portal"
# Only loopback, and never through a proxy that the environment may name.
_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))

_HASHES = {"RS256": hashes.SHA256, "RS384": hashes.SHA384, "RS512": hashes.SHA512}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _int(value: int) -> str:
    return b64url(value.to_bytes((value.bit_length() + 7) // 8 or 1, "big"))


# --- Keys and tokens


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_jwk(key: rsa.RSAPrivateKey | rsa.RSAPublicKey, kid: str | None = None) -> dict:
    """The public JWK (RFC 7517) of an RSA key; without `kid`, its RFC 7638 thumbprint."""
    public = key.public_key() if isinstance(key, rsa.RSAPrivateKey) else key
    numbers = public.public_numbers()
    members = {"e": _int(numbers.e), "kty": "RSA", "n": _int(numbers.n)}
    if kid is None:
        canonical = json.dumps(members, separators=(",", ":"), sort_keys=True).encode()
        kid = b64url(hashlib.sha256(canonical).digest())
    return {**members, "kid": kid, "use": "sig", "alg": "RS256"}


def private_jwk(key: rsa.RSAPrivateKey, kid: str) -> dict:
    """The private JWK of `key`, as the provider signs with it."""
    numbers = key.private_numbers()
    return {
        **public_jwk(key, kid),
        "d": _int(numbers.d), "p": _int(numbers.p), "q": _int(numbers.q),
        "dp": _int(numbers.dmp1), "dq": _int(numbers.dmq1), "qi": _int(numbers.iqmp),
    }  # fmt: skip


def sign_jwt(claims: dict, private_key: rsa.RSAPrivateKey, kid: str, alg: str = "RS256") -> str:
    """A compact JWS of `claims` (RFC 7515): RSASSA-PKCS1-v1_5 with the alg's SHA-2, or an empty
    signature for alg "none" (a token no client may accept)."""
    header = {"alg": alg, "typ": "JWT", "kid": kid}
    signing_input = ".".join(
        b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
    )
    if alg == "none":
        return f"{signing_input}."
    if alg not in _HASHES:
        raise ValueError(f"sign_jwt signs RS256, RS384, RS512 or none, not {alg!r}")
    signature = private_key.sign(signing_input.encode(), padding.PKCS1v15(), _HASHES[alg]())
    return f"{signing_input}.{b64url(signature)}"


# --- The npm install


def npm_ci(timeout_s: float = NPM_TIMEOUT_S) -> None:
    """`npm ci` in tests/oidc_provider when node_modules is missing or older than the lock; one
    process at a time (a lock file), so parallel runs do not install over each other."""
    with open(SERVER_DIR / ".npm-ci.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if INSTALLED.exists() and INSTALLED.stat().st_mtime >= LOCK_FILE.stat().st_mtime:
            return
        env = os.environ | {"npm_config_update_notifier": "false"}
        try:
            done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=SERVER_DIR, env=env,
                                  capture_output=True, text=True, timeout=timeout_s, check=False)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            tail = (exc.stderr or b"")[-2000:]
            tail = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
            raise RuntimeError(f"npm ci in {SERVER_DIR} took over {timeout_s}s:\n{tail}") from None
        if done.returncode != 0:
            raise RuntimeError(f"npm ci in {SERVER_DIR} exited {done.returncode}:\n{done.stderr[-2000:]}")


# --- The provider


@dataclass
class OidcProvider:
    """A running provider: its issuer and endpoints (from its discovery document), the one
    client, the signing key, and the users file that `set_user` and `remove_user` rewrite."""

    issuer: str
    port: int
    client_id: str
    client_secret: str
    private_key: rsa.RSAPrivateKey
    kid: str
    folder: Path
    users_file: Path
    discovery: dict = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    users: dict[str, dict] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def authorization_endpoint(self) -> str:
        return self.discovery["authorization_endpoint"]

    @property
    def token_endpoint(self) -> str:
        return self.discovery["token_endpoint"]

    @property
    def userinfo_endpoint(self) -> str:
        return self.discovery["userinfo_endpoint"]

    @property
    def jwks_uri(self) -> str:
        return self.discovery["jwks_uri"]

    @property
    def end_session_endpoint(self) -> str:
        return self.discovery["end_session_endpoint"]

    def public_jwk(self) -> dict:
        return public_jwk(self.private_key, self.kid)

    def log_tail(self, chars: int = 3000) -> str:
        return (self.folder / "provider.log").read_text(errors="replace")[-chars:]

    def set_user(self, login: str, password: str, **claims) -> None:
        """Add or replace a user; `claims` as the provider states them (sub defaults to the login;
        groups is sent exactly as given, a list or not)."""
        with self._lock:
            self.users[login] = {"password": password, "claims": {"sub": login, **claims}}
            self._write_users()

    def remove_user(self, login: str) -> None:
        with self._lock:
            del self.users[login]
            self._write_users()

    def _write_users(self) -> None:
        """Atomically: the server never reads half a file."""
        part = self.users_file.with_name(f".{self.users_file.name}.{secrets.token_hex(4)}")
        part.write_text(json.dumps(self.users, indent=1))
        os.replace(part, self.users_file)


def _get_json(url: str) -> dict:
    with _LOOPBACK.open(url, timeout=HTTP_TIMEOUT_S) as response:
        return json.loads(response.read())


@contextmanager
def oidc_provider(
    workdir: Path,
    redirect_uri: str,
    post_logout_redirect_uri: str,
    client_name: str = "Campus SSO",
    auth_method: str = "client_secret_post",
) -> Iterator[OidcProvider]:
    """The provider with one client and no user, its files in `workdir` (made), running until the
    block ends. `auth_method`: how the client authenticates at the token endpoint, as
    mozilla-django-oidc does (client_secret_post; client_secret_basic with OIDC_TOKEN_USE_BASIC_AUTH)."""
    npm_ci()
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    key = rsa_key()
    provider = OidcProvider(
        issuer=f"http://127.0.0.1:{port}", port=port, client_id=CLIENT_ID,
        client_secret=secrets.token_urlsafe(32), private_key=key, kid=f"test-{public_jwk(key)['kid'][:16]}",
        folder=workdir, users_file=workdir / "users.json",
    )  # fmt: skip
    provider._write_users()
    config = {
        "port": port,
        "clients": [
            {
                "client_id": provider.client_id,
                "client_secret": provider.client_secret,
                "client_name": client_name,
                "redirect_uris": [redirect_uri],
                "post_logout_redirect_uris": [post_logout_redirect_uri],
                "token_endpoint_auth_method": auth_method,
            }
        ],
        "jwks": {"keys": [private_jwk(key, provider.kid)]},
        "users_file": str(provider.users_file),
    }
    config_file = workdir / "provider.json"
    config_file.touch(mode=0o600)
    config_file.write_text(json.dumps(config, indent=1))
    with open(workdir / "provider.log", "w") as log:
        provider.proc = subprocess.Popen(["node", "server.mjs", str(config_file)], cwd=SERVER_DIR,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=die_with_parent)  # fmt: skip
    try:

        def discovered():
            assert provider.proc.poll() is None, (
                f"the provider exited with {provider.proc.returncode}:\n{provider.log_tail()}"
            )
            try:
                return _get_json(f"{provider.issuer}/.well-known/openid-configuration")
            except OSError:
                return None

        provider.discovery = wait_until(
            discovered, timeout_s=START_TIMEOUT_S, interval_s=0.05, what="the provider's discovery document"
        )
        assert provider.discovery["issuer"] == provider.issuer, provider.discovery
        yield provider
    finally:
        stop(provider.proc, timeout_s=5)
