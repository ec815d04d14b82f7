from portal.core.errors import PortalError


class TenantSuspended(PortalError):
    code = "tenant_suspended"


class LastOwner(PortalError):
    code = "last_owner"


class NoQuota(PortalError):
    code = "no_quota"


class QuotaExhausted(PortalError):
    code = "quota_exhausted"
