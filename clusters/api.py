from drf_spectacular.utils import OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from clusters import advisor, selectors
from clusters.models import Scenario
from clusters.serializers import ADVICE_IN, AdviceOut, ClusterOut, GpuModelOut, ScenarioOut
from portal.core.pagination import CursorPage
from portal.core.serializers import SLUG_LOOKUP


class BySlug(CursorPage):
    ordering = "slug"
    position_pattern = SLUG_LOOKUP


class GpuModelViewSet(viewsets.ReadOnlyModelViewSet):
    """The GPU catalog: datasheet figures and each scheduler's name for the model."""

    serializer_class = GpuModelOut
    pagination_class = BySlug
    lookup_field = "slug"
    lookup_value_regex = SLUG_LOOKUP

    def get_queryset(self):
        return selectors.gpu_model_list()


ADVICE_IN_SCHEMA = PolymorphicProxySerializer(
    component_name="AdviceIn",
    serializers=list(ADVICE_IN.values()),
    resource_type_field_name=None,
)


class ScenarioViewSet(viewsets.ReadOnlyModelViewSet):
    """Workload scenarios, each with its GPU models in rank order and job defaults."""

    serializer_class = ScenarioOut
    pagination_class = BySlug
    lookup_field = "slug"
    lookup_value_regex = SLUG_LOOKUP
    schema_conflicts = False  # advise/ only computes

    def get_queryset(self):
        return selectors.scenario_list()

    @extend_schema(
        request=ADVICE_IN_SCHEMA,
        responses={
            200: AdviceOut,
            400: OpenApiResponse(description="problem+json; `errors` names each invalid field."),
            404: OpenApiResponse(description="No such scenario, or the scenario has no sizing advisor."),
        },
        description=(
            "Size a job on every GPU model the scenario ranks. The body depends on the scenario's "
            "`advisor`: `ai` takes AdviceInAi (the seeded `ai-training`), `md` AdviceInMd "
            "(`molecular-dynamics`), `cfd` AdviceInCfd (`cfd`)."
        ),
    )
    @action(detail=True, methods=["post"])
    def advise(self, request, slug=None):
        scenario: Scenario = self.get_object()
        form_class = ADVICE_IN.get(scenario.advisor)
        if form_class is None:
            # 404, not 400: no body could make this request valid; the advice does not exist.
            raise NotFound(f"Scenario {scenario.slug!r} has no sizing advisor.")
        form = form_class(data=request.data, context={"request": request})
        form.is_valid(raise_exception=True)
        gpus = [entry.gpu_model for entry in scenario.ranking.all()]
        advice = advisor.advise(advisor=scenario.advisor, job=form.job(), gpus=gpus)
        return Response(AdviceOut(advice).data)


class ClusterViewSet(viewsets.ReadOnlyModelViewSet):
    """Enabled clusters and their partitions; never a connection setting or secret."""

    serializer_class = ClusterOut
    pagination_class = BySlug
    lookup_field = "slug"
    lookup_value_regex = SLUG_LOOKUP

    def get_queryset(self):
        return selectors.cluster_list()
