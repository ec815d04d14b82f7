from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from tenants.selectors import memberships_of


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return render(request, "home.html", {"memberships": memberships_of(user=request.user)})
