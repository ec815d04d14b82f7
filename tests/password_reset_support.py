"""What the password reset tests share: its pages, the link in its mail, and following that link
to set a new password."""

import re

RESET = "/accounts/password_reset/"
DONE = "/accounts/password_reset/done/"
LINK = re.compile(r"(https?://[^/\s]+)(/accounts/reset/[\w-]+/[\w-]+/)")
NEW_PASSWORD = "a quite different horse 42"


def reset_link(message) -> str:
    """The path of the one reset link in the mail."""
    links = LINK.findall(message.body)
    assert len(links) == 1, message.body
    return links[0][1]


def set_password(client, link: str, password: str = NEW_PASSWORD):
    """Follow the mailed link as Django wants it (the token moves into the session) and post."""
    form_page = client.get(link, follow=True)
    assert form_page.context["validlink"], form_page.content.decode()
    return client.post(
        form_page.redirect_chain[-1][0], {"new_password1": password, "new_password2": password}
    )
