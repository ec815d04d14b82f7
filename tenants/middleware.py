"""Request-scoped state the tenant selectors share."""

from tenants.selectors import tenant_perms_memoized


def tenant_perms_per_request(get_response):
    """A request reads the caller's tenant permissions once (tenants.selectors.tenant_perm_map),
    however many checks it makes; the next request reads them afresh."""

    def middleware(request):
        with tenant_perms_memoized():
            return get_response(request)

    return middleware
