"""login, logout, whoami: the token the CLI holds, and who it is."""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import click

from gpuportal import config, output
from gpuportal.app import (
    EXIT_API,
    TOKEN_NAME,
    UsageProblem,
    app,
    connect,
    json_option,
    loopback,
    settings_or_usage,
)
from gpuportal.client import Client, normalize_url
from gpuportal.errors import ApiError
from gpuportal.i18n import _

# --- login, logout, whoami -------------------------------------------------------------------------


@app.command(
    short_help=_("Log in and store a token (mode 0600)."),
    help=_(
        "Log in to the portal and store a token in your config folder (mode 0600).\n\n"
        "Asks for the URL (unless --url or GPUPORTAL_URL gives it), the username and the password "
        "(hidden), or reads the password from stdin with --password-stdin. With --token, stores a "
        "token made on the portal's Tokens page instead (`--token -` reads it from stdin)."
    ),
)
@click.option("--url", help=_("The portal, e.g. https://gpu.example.org."))
@click.option("--username", "-u", help=_("Your portal username."))
@click.option("--password-stdin", is_flag=True, help=_("Read the password from the first line of stdin."))
@click.option(
    "--token",
    "supplied_key",
    metavar="TOKEN",
    help=_("Store this API token instead ('-': read it from stdin)."),
)
@click.option(
    "--name", "token_name", metavar="NAME", help=_("A name for the new token (default: gpuportal on <host>).")
)
@click.option(
    "--scope",
    type=click.Choice(["read", "submit", "admin"]),
    help=_("The new token's scope (default: the widest you may hold)."),
)
@click.option(
    "--expires-in-days",
    type=click.IntRange(1, 3650),
    help=_("The new token's lifetime in days (default: the portal's, 90)."),
)
@json_option
def login(url, username, password_stdin, supplied_key, token_name, scope, expires_in_days, as_json) -> None:
    settings = settings_or_usage()
    stored = settings.stored
    reads_stdin = password_stdin or supplied_key == "-"
    if not url and settings.url and (settings.url_from == "env" or reads_stdin):
        url = settings.url  # GPUPORTAL_URL, or the stored one when stdin is for the secret
    if not url:
        url = click.prompt(_("Portal URL"), default=settings.url, err=True)
    try:
        url = normalize_url(url)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None
    if url.startswith("http://") and not loopback(url):
        output.warn(
            _("{url} is plain HTTP: your password and token cross the network unencrypted.").format(url=url)
        )
    created = None
    if supplied_key:
        token = sys.stdin.readline().strip() if supplied_key == "-" else supplied_key.strip()
        if not token:
            raise UsageProblem(_("No token given."))
        with client_for(url, token, settings) as client:
            username = client.me()["username"]
    else:
        if not username:
            username = click.prompt(_("Username"), default=stored.get("username") or None, err=True)
        if password_stdin:
            password = sys.stdin.readline().rstrip("\r\n")
        else:
            password = click.prompt(_("Password"), hide_input=True, err=True)
        if not password:
            raise UsageProblem(_("No password given."))
        name = token_name or TOKEN_NAME.format(host=socket.gethostname())[:100]
        with client_for(url, None, settings) as client:
            created = client.token_create(
                username, password, name=name, scope=scope, expires_in_days=expires_in_days
            )
        token = created["token"]
    record = {"url": url, "token": token, "username": username}
    if created:
        record |= {
            "token_id": created["id"],
            "scope": created.get("scope", ""),
            "expires": created.get("expires", ""),
        }
    path = config.save(record)
    revoke_replaced(stored, url, token)
    if as_json:
        public = {k: v for k, v in created.items() if k != "token"} if created else None
        output.print_json({"url": url, "username": username, "token": public, "config": str(path)})
    else:
        output.say(_("Logged in to {url} as {username}.").format(url=url, username=username), style="green")
        if created:
            output.say(
                _("Token {name!r} ({scope}) stored in {path}; it expires {expires}.").format(
                    name=created["name"],
                    scope=created.get("scope", ""),
                    path=path,
                    expires=output.when(created.get("expires")),
                )
            )
        else:
            output.say(_("Token stored in {path}.").format(path=path))
    if os.environ.get(config.ENV_TOKEN):
        output.warn(_("GPUPORTAL_TOKEN is set: it overrides the stored token until you unset it."))


def client_for(url: str, token: str | None, settings: config.Settings) -> Client:
    try:
        return Client(url, token, timeout_s=settings.timeout_s, ca_bundle=settings.ca_bundle)
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None


def revoke_replaced(stored: dict[str, Any], url: str, token: str) -> None:
    """The token an earlier `login` made for this portal, revoked once a new one replaced it
    (best effort: one that does not answer stays until it expires)."""
    if not (stored.get("token_id") and stored.get("token") and stored.get("token") != token):
        return
    if stored.get("url") != url:
        return
    try:
        with Client(url, stored["token"], timeout_s=10) as client:
            client.token_delete(str(stored["token_id"]))
    except (ApiError, ValueError):
        pass


@app.command(
    help=_("Forget the stored token, and revoke it on the portal if `gpuportal login` made it."),
    short_help=_("Forget (and revoke) the stored token."),
)
@json_option
def logout(as_json) -> None:
    stored = config.load()
    revoked, error = False, None
    if stored.get("token") and stored.get("token_id") and stored.get("url"):
        try:
            with Client(stored["url"], stored["token"], timeout_s=settings_or_usage().timeout_s) as client:
                client.token_delete(str(stored["token_id"]))
            revoked = True
        except ApiError as exc:
            if exc.status not in (401, 404):  # already revoked or expired: nothing left to revoke
                error = exc
        except ValueError:
            pass
    removed = config.remove()
    if as_json:
        output.print_json({"removed": removed, "revoked": revoked, "config": str(config.config_path())})
    elif removed:
        output.say(_("Logged out: removed {path}.").format(path=config.config_path()))
        if revoked:
            output.say(_("The token was revoked on the portal."))
    else:
        output.say(_("Not logged in: nothing stored."))
    if error is not None:
        output.warn(_("The token could not be revoked on the portal; revoke it on its Tokens page."))
        output.api_error(error)
        raise click.exceptions.Exit(EXIT_API)


@app.command(
    help=_("Who you are on the portal: your account, and your tenants with your role in each."),
    short_help=_("Your account and tenants."),
)
@json_option
def whoami(as_json) -> None:
    with connect() as client:
        me = client.me()
    if as_json:
        output.print_json(me)
        return
    settings = settings_or_usage()
    sources = {"env": _("environment"), "config": _("config file")}
    output.fields(
        [
            (_("Portal"), f"{client.url}  ({sources.get(settings.url_from, '')})"),
            (_("Username"), me["username"]),
            (_("Email"), me.get("email", "")),
            (_("Staff roles"), ", ".join(me.get("staff_roles") or []) or _("none")),
            (_("Platform admin"), output.yes_no(me.get("platform_admin"))),
            (_("Token from"), sources.get(settings.token_from, "")),
        ]
    )
    output.say("")
    output.table(
        [_("Tenant"), _("Name"), _("Role")],
        [(t["slug"], t["name"], t["role"]) for t in me["tenants"]],
        title=_("Tenants"),
    )
