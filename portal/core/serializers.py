from rest_framework import serializers

from portal.core.models import ApiToken


class TokenIn(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    password = serializers.CharField(max_length=256, trim_whitespace=False, style={"input_type": "password"})
    name = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)


class TokenOut(serializers.ModelSerializer):
    id = serializers.CharField(read_only=True)

    class Meta:
        model = ApiToken
        fields = ["id", "name", "created", "last_used"]


class TokenCreatedOut(TokenOut):
    token = serializers.CharField(read_only=True, help_text="The key. Shown this once; store it now.")

    class Meta(TokenOut.Meta):
        fields = ["id", "name", "token", "created"]
