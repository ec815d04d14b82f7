"""The suite's OpenID provider (tests/oidc_support.py, panva's oidc-provider on loopback) is real
and behaves as the portal's sign-in needs: its discovery document; the authorization code flow
done by hand, PKCE required, an RS256 ID token with the user's claims (groups, uid) that verifies
against the published keys; the login form again after a wrong password; the users file read
at every sign-in (groups changed, a user removed); prompt=none without a session refused with
login_required; a logout page that submits itself and returns to the client; `sign_jwt`'s tokens
verify with the published key. No database."""

import base64
import hashlib
import json
import re
import secrets
from dataclasses import dataclass
from html import unescape
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
import requests
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.oidc_support import b64url, oidc_provider, rsa_key, sign_jwt

# The client's URIs: nothing listens on port 9, and no test fetches them (the Location is read).
REDIRECT_URI = "http://127.0.0.1:9/accounts/oidc/callback/"
POST_LOGOUT_URI = "http://127.0.0.1:9/accounts/login/"
SCOPE = "openid profile email groups"
MAX_HOPS = 10
TIMEOUT_S = 5


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    with oidc_provider(
        tmp_path_factory.mktemp("oidc"), redirect_uri=REDIRECT_URI, post_logout_redirect_uri=POST_LOGOUT_URI
    ) as running:
        running.set_user("olivia", "olivia-secret-1", sub="sub-olivia", preferred_username="olivia",
                         email="olivia@uni.example", name="Olivia Ng", groups=["gpu-protein-owners"],
                         uid="ong42")  # fmt: skip
        yield running


def browser() -> requests.Session:
    """A cookie jar that never goes through a proxy the environment may name."""
    session = requests.Session()
    session.trust_env = False
    return session


@dataclass
class Flow:
    state: str
    nonce: str
    verifier: str


def start(provider, session, *, pkce: bool = True, **params) -> tuple[Flow, requests.Response]:
    """GET the authorization endpoint as the portal sends the browser there."""
    flow = Flow(secrets.token_urlsafe(16), secrets.token_urlsafe(16), secrets.token_urlsafe(48))
    query = {"response_type": "code", "client_id": provider.client_id, "redirect_uri": REDIRECT_URI,
             "scope": SCOPE, "state": flow.state, "nonce": flow.nonce, **params}  # fmt: skip
    if pkce:
        challenge = b64url(hashlib.sha256(flow.verifier.encode()).digest())
        query |= {"code_challenge": challenge, "code_challenge_method": "S256"}
    response = session.get(
        provider.authorization_endpoint, params=query, allow_redirects=False, timeout=TIMEOUT_S
    )
    return flow, response


def follow(session, response) -> requests.Response | dict[str, str]:
    """Follow the provider's redirects; the query sent to a client URI (not fetched), or the page
    where they stop."""
    for _ in range(MAX_HOPS):
        if not response.is_redirect:
            return response
        location = urljoin(response.url, response.headers["Location"])
        if location.startswith((REDIRECT_URI, POST_LOGOUT_URI)):
            return {name: values[0] for name, values in parse_qs(urlsplit(location).query).items()}
        response = session.get(location, allow_redirects=False, timeout=TIMEOUT_S)
    raise AssertionError(f"more than {MAX_HOPS} redirects, last {response.url}")


def form_action(page: requests.Response) -> str:
    match = re.search(r'<form[^>]* action="([^"]+)"', page.text)
    assert match, page.text
    return urljoin(page.url, unescape(match.group(1)))


def submit_login(session, page: requests.Response, login: str, password: str):
    response = session.post(form_action(page), data={"login": login, "password": password},
                            allow_redirects=False, timeout=TIMEOUT_S)  # fmt: skip
    return follow(session, response)


def sign_in(provider, session, login: str, password: str) -> tuple[Flow, dict[str, str]]:
    """The whole front channel: authorize, the login form, back to the client with a code."""
    flow, response = start(provider, session)
    page = follow(session, response)
    assert isinstance(page, requests.Response) and page.status_code == 200, page
    answer = submit_login(session, page, login, password)
    assert isinstance(answer, dict), answer.text
    assert answer.get("state") == flow.state and answer.get("iss") == provider.issuer, answer
    return flow, answer


def exchange(provider, code: str, verifier: str | None) -> requests.Response:
    body = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT_URI,
            "client_id": provider.client_id, "client_secret": provider.client_secret}  # fmt: skip
    if verifier is not None:
        body["code_verifier"] = verifier
    return browser().post(provider.token_endpoint, data=body, timeout=TIMEOUT_S)


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verified_claims(provider, token: str) -> dict:
    """The ID token's claims once its RS256 signature verifies with the key of its kid in the
    provider's jwks_uri."""
    header_b64, payload_b64, signature_b64 = token.split(".")
    header = json.loads(_unb64(header_b64))
    assert header["alg"] == "RS256" and header["kid"] == provider.kid, header
    keys = browser().get(provider.jwks_uri, timeout=TIMEOUT_S).json()["keys"]
    jwk = next(key for key in keys if key["kid"] == header["kid"])
    assert "d" not in jwk, "the JWKS publishes a private key"
    numbers = rsa.RSAPublicNumbers(int.from_bytes(_unb64(jwk["e"])), int.from_bytes(_unb64(jwk["n"])))
    numbers.public_key().verify(  # raises InvalidSignature
        _unb64(signature_b64), f"{header_b64}.{payload_b64}".encode(), padding.PKCS1v15(), hashes.SHA256()
    )
    return json.loads(_unb64(payload_b64))


def tokens_for(provider, login: str, password: str) -> tuple[Flow, dict]:
    session = browser()
    flow, answer = sign_in(provider, session, login, password)
    response = exchange(provider, answer["code"], flow.verifier)
    assert response.status_code == 200, response.text
    return flow, response.json()


def test_the_discovery_document_names_the_issuer_pkce_and_the_logout_endpoint(provider):
    document = browser().get(f"{provider.issuer}/.well-known/openid-configuration", timeout=TIMEOUT_S).json()
    assert document["issuer"] == provider.issuer == f"http://127.0.0.1:{provider.port}"
    assert document["code_challenge_methods_supported"] == ["S256"]
    assert document["end_session_endpoint"] == provider.end_session_endpoint
    assert document["response_types_supported"] == ["code"]
    assert {"openid", "profile", "email", "groups"} <= set(document["scopes_supported"])
    assert {"groups", "uid", "preferred_username", "email"} <= set(document["claims_supported"])
    assert document["id_token_signing_alg_values_supported"] == ["RS256"]


def test_a_sign_in_by_hand_gives_an_rs256_id_token_with_the_users_claims(provider):
    session = browser()
    flow, response = start(provider, session)
    page = follow(session, response)
    assert page.url.startswith(f"{provider.issuer}/interaction/")
    assert 'name="login"' in page.text and 'name="password"' in page.text
    assert ">Sign in</button>" in page.text and "Campus SSO" in page.text
    answer = submit_login(session, page, "olivia", "olivia-secret-1")
    assert answer["state"] == flow.state and answer["iss"] == provider.issuer

    response = exchange(provider, answer["code"], flow.verifier)
    assert response.status_code == 200, response.text
    tokens = response.json()
    claims = verified_claims(provider, tokens["id_token"])
    assert claims["iss"] == provider.issuer and claims["aud"] == provider.client_id
    assert claims["nonce"] == flow.nonce
    assert claims["sub"] == "sub-olivia" and claims["preferred_username"] == "olivia"
    assert (claims["groups"], claims["uid"]) == (["gpu-protein-owners"], "ong42")
    assert claims["email"] == "olivia@uni.example"
    assert claims["exp"] > claims["iat"]

    info = browser().get(provider.userinfo_endpoint, timeout=TIMEOUT_S,
                         headers={"Authorization": f"Bearer {tokens['access_token']}"})  # fmt: skip
    assert info.status_code == 200, info.text
    about = info.json()
    assert (about["sub"], about["groups"], about["uid"]) == ("sub-olivia", ["gpu-protein-owners"], "ong42")
    # A code serves once.
    assert exchange(provider, answer["code"], flow.verifier).json()["error"] == "invalid_grant"


def test_a_request_without_pkce_is_refused_and_so_is_a_code_without_its_verifier(provider):
    flow, response = start(provider, browser(), pkce=False)
    answer = follow(browser(), response)
    assert answer["error"] == "invalid_request" and "code" not in answer, answer
    assert answer["state"] == flow.state

    _, response = start(
        provider, browser(), pkce=False, code_challenge="x" * 43, code_challenge_method="plain"
    )
    assert follow(browser(), response)["error"] == "invalid_request"

    session = browser()
    flow, answer = sign_in(provider, session, "olivia", "olivia-secret-1")
    refused = exchange(provider, answer["code"], None)
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_grant", refused.text


def test_a_wrong_password_shows_the_form_again_with_an_error(provider):
    session = browser()
    flow, response = start(provider, session)
    page = follow(session, response)
    again = submit_login(session, page, "olivia", "not-her-password")
    assert isinstance(again, requests.Response) and again.status_code == 200
    assert "Wrong login or password." in again.text and 'name="password"' in again.text
    no_such_user = submit_login(session, again, "nobody", "olivia-secret-1")
    assert no_such_user.text.count("Wrong login or password.") == 1
    answer = submit_login(session, again, "olivia", "olivia-secret-1")
    assert answer["state"] == flow.state and answer["code"]


def test_groups_changed_in_the_users_file_show_in_the_next_sign_in(provider):
    provider.set_user(
        "gus", "gus-secret-1", preferred_username="gus", groups=["gpu-protein-viewers"], uid="g1"
    )
    _, tokens = tokens_for(provider, "gus", "gus-secret-1")
    assert verified_claims(provider, tokens["id_token"])["groups"] == ["gpu-protein-viewers"]

    provider.set_user("gus", "gus-secret-1", preferred_username="gus", groups=["a", "b"], uid="g2")
    _, tokens = tokens_for(provider, "gus", "gus-secret-1")
    claims = verified_claims(provider, tokens["id_token"])
    assert (claims["sub"], claims["groups"], claims["uid"]) == ("gus", ["a", "b"], "g2")

    # What the file says goes out as it is, even a groups claim that is no list.
    provider.set_user("gus", "gus-secret-1", preferred_username="gus", groups="gpu-protein-owners")
    _, tokens = tokens_for(provider, "gus", "gus-secret-1")
    assert verified_claims(provider, tokens["id_token"])["groups"] == "gpu-protein-owners"


def test_prompt_none_without_a_session_answers_login_required(provider):
    flow, response = start(provider, browser(), prompt="none")
    answer = follow(browser(), response)
    assert answer["error"] == "login_required" and answer["state"] == flow.state, answer


def test_prompt_none_signs_in_silently_until_the_user_is_removed(provider):
    provider.set_user("pat", "pat-secret-1", preferred_username="pat", groups=["v"])
    session = browser()
    sign_in(provider, session, "pat", "pat-secret-1")
    provider.set_user("pat", "pat-secret-1", preferred_username="pat", groups=["w"])
    flow, response = start(provider, session, prompt="none")
    answer = follow(session, response)
    tokens = exchange(provider, answer["code"], flow.verifier).json()
    assert verified_claims(provider, tokens["id_token"])["groups"] == ["w"]

    provider.remove_user("pat")
    flow, response = start(provider, session, prompt="none")
    assert follow(session, response)["error"] == "login_required"
    page = follow(session, start(provider, session)[1])  # without prompt=none: the login form
    assert 'name="password"' in page.text


def test_the_logout_page_submits_itself_ends_the_session_and_returns_to_the_client(provider):
    session = browser()
    flow, answer = sign_in(provider, session, "olivia", "olivia-secret-1")
    id_token = exchange(provider, answer["code"], flow.verifier).json()["id_token"]
    params = {"id_token_hint": id_token, "post_logout_redirect_uri": POST_LOGOUT_URI,
              "client_id": provider.client_id}  # fmt: skip
    page = session.get(provider.end_session_endpoint, params=params, timeout=TIMEOUT_S)
    assert page.status_code == 200 and "document.forms[0].submit()" in page.text
    inputs = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page.text))
    assert inputs["logout"] == "yes" and inputs["xsrf"]
    done = session.post(form_action(page), data=inputs, allow_redirects=False, timeout=TIMEOUT_S)
    assert done.status_code == 303 and done.headers["Location"] == POST_LOGOUT_URI

    flow, response = start(provider, session, prompt="none")
    assert follow(session, response)["error"] == "login_required"


def test_sign_jwt_makes_tokens_that_the_published_key_verifies_and_no_other(provider):
    claims = {"iss": provider.issuer, "aud": provider.client_id, "sub": "sub-mallory", "groups": ["g"]}
    assert verified_claims(provider, sign_jwt(claims, provider.private_key, provider.kid)) == claims
    with pytest.raises(InvalidSignature):
        verified_claims(provider, sign_jwt(claims, rsa_key(), provider.kid))
