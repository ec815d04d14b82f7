from drf_spectacular.extensions import OpenApiAuthenticationExtension


class HashedTokenScheme(OpenApiAuthenticationExtension):
    target_class = "portal.core.auth.HashedTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <key>`; create a key with POST /api/v1/auth/token/.",
        }
