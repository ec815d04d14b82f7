"""The personal API tokens page: a signed-in user (whether their password is the portal's, the
directory's or the identity provider's) makes, lists and revokes their own tokens; a new key is
shown once, in the answer to the form, and never again (docs/api.md, Tokens)."""

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_POST

from portal.core.models import TokenScope
from portal.core.selectors import tokens_of
from portal.core.tokens import token_create, token_revoke, token_scopes_for

SCOPE_HELP = {
    TokenScope.READ: gettext_lazy("read: GET only"),
    TokenScope.SUBMIT: gettext_lazy("submit: jobs and quota"),
    TokenScope.ADMIN: gettext_lazy("admin: staff powers too"),
}


class TokenForm(forms.Form):
    name = forms.CharField(
        label=gettext_lazy("Name"),
        max_length=100,
        help_text=gettext_lazy("Where it is used, e.g. the lab's workflow server."),
    )
    scope = forms.ChoiceField(label=gettext_lazy("Scope"))
    expires_in_days = forms.IntegerField(label=gettext_lazy("Expires in (days)"), min_value=1)

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        scopes = token_scopes_for(user)
        self.fields["scope"].choices = [(scope, SCOPE_HELP[scope]) for scope in scopes]
        self.fields["scope"].initial = TokenScope.SUBMIT
        days = self.fields["expires_in_days"]
        days.validators.append(MaxValueValidator(settings.API_TOKEN_MAX_DAYS))  # the site's, read now
        days.initial = settings.API_TOKEN_DAYS
        days.help_text = _("At most %(days)s days.") % {"days": settings.API_TOKEN_MAX_DAYS}
        days.widget.attrs.update(min=1, max=settings.API_TOKEN_MAX_DAYS)


def _page(request: HttpRequest, form: TokenForm, *, created=None, status: int = 200) -> HttpResponse:
    context = {"form": form, "tokens": tokens_of(user=request.user), "created": created}
    return render(request, "account/tokens.html", context, status=status)


@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    return _page(request, TokenForm(user=request.user))


@login_required
@require_POST
def token_new(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST, user=request.user)
    if form.is_valid():
        try:
            token, key = token_create(
                user=request.user,
                name=form.cleaned_data["name"],
                scope=form.cleaned_data["scope"],
                days=form.cleaned_data["expires_in_days"],
            )
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            token.key = key
            # The key is in this answer only: a redirect would have to keep it somewhere.
            response = _page(request, TokenForm(user=request.user), created=token, status=201)
            response["Cache-Control"] = "no-store"  # the key: in no cache, not even the browser's
            return response
    return _page(request, form, status=400)


@login_required
@require_POST
def token_delete(request: HttpRequest, token_id: int) -> HttpResponse:
    token = tokens_of(user=request.user).filter(pk=token_id).first()
    if token is None:
        raise Http404
    token_revoke(token=token, actor=request.user)
    messages.success(request, _("The token “%(name)s” is revoked.") % {"name": token.name or token.pk})
    return redirect("tokens")
