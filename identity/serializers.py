"""The group mapping API's bodies."""

from rest_framework import serializers

from identity.models import GroupMapping, Source
from portal.core.serializers import SlugRef, StrictCharField
from tenants.models import Role, Tenant


class GroupMappingIn(serializers.Serializer):
    source = serializers.ChoiceField(
        choices=Source.choices, help_text="oidc: a group claim value; ldap: a DN."
    )
    group = StrictCharField(max_length=512)
    tenant = SlugRef(queryset=Tenant.objects.all())
    role = serializers.ChoiceField(choices=Role.choices)


class GroupMappingPatch(serializers.Serializer):
    role = serializers.ChoiceField(choices=Role.choices)


class GroupMappingOut(serializers.ModelSerializer):
    id = serializers.CharField(read_only=True)
    tenant = serializers.CharField(source="tenant.slug")

    class Meta:
        model = GroupMapping
        fields = ["id", "source", "group", "tenant", "role", "created"]
