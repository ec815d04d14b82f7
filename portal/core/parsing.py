from rest_framework.request import Request


def parsed(serializer_class, request: Request, **kwargs) -> dict:
    """The request body, validated by the serializer; a 400 naming each bad field otherwise."""
    serializer = serializer_class(data=request.data, context={"request": request}, **kwargs)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data
