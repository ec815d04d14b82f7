from rest_framework import serializers


class MeTenantOut(serializers.Serializer):
    slug = serializers.CharField(source="tenant.slug")
    name = serializers.CharField(source="tenant.name")
    role = serializers.CharField()


class MeOut(serializers.Serializer):
    username = serializers.CharField()
    email = serializers.EmailField()
    is_staff = serializers.BooleanField()
    tenants = MeTenantOut(many=True)
