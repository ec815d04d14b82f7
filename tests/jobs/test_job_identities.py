"""Whom a job runs as on a Slurm cluster (docs/architecture.md, Identities): a cluster account of
the tenant's (its own setting, else the cluster's template) or the researcher's own cluster
username; a submission with none answers 400 naming `cluster`; the identity is fixed on the job
at submission; the team page says whether each account is ready. The submissions here stop at
the portal (the cluster record has no reachable login node): what reaches Slurm, and what a
hostile job can do there, is tests/clusters/test_slurm_hostile.py's."""

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from clusters.models import IdentityCheck, JobIdentity
from jobs.models import Job
from tenants.limits import identities_record, tenant_limits
from tenants.models import ClusterAccount, Profile, Role
from tenants.selectors import job_identity_of, tenant_identities
from tests.browser import browser_page, log_in, screenshot
from tests.conftest import join
from tests.factories import ClusterFactory, PartitionFactory
from tests.jobs_support import JOB


@pytest.fixture
def slurm(catalog):
    """A Slurm cluster of the catalog's GPU model, per tenant by default, its login node nowhere."""
    cluster = ClusterFactory(
        slug="hpc", name="HPC", kind="slurm", ssh_host="192.0.2.1", ssh_user="gpuportal",
        scratch_root="/shared/portal-jobs",
    )  # fmt: skip
    PartitionFactory(
        cluster=cluster,
        name="gpu",
        gpu_model=catalog[1],
        nodes=2,
        max_cpus_per_gpu=1,
        max_mem_per_gpu_mb=1000,
    )
    return cluster


def submit(client, **fields):
    return client.post("/api/v1/jobs/", JOB | {"cluster": "hpc", "gpus": 1} | fields, format="json")


def test_per_tenant_the_template_names_the_account_and_the_tenants_own_setting_wins(
    slurm, tenant, member, client_for, grant
):
    assert job_identity_of(cluster=slurm, tenant=tenant, user=member) == "protein-lab"
    slurm.tenant_identity_template = "t-{tenant}"
    slurm.save()
    answer = submit(client_for(member))
    assert answer.status_code == 201, answer.content
    assert Job.objects.get(pk=answer.json()["id"]).cluster_user == "t-protein-lab"
    assert "cluster_user" not in answer.json()  # whom it runs as is the site's, not the API's

    ClusterAccount.objects.create(tenant=tenant, cluster=slurm, username="grp-protein")
    later = submit(client_for(member)).json()
    assert Job.objects.get(pk=later["id"]).cluster_user == "grp-protein"
    assert Job.objects.get(pk=answer.json()["id"]).cluster_user == "t-protein-lab"  # fixed at submission
    assert tenant_identities(cluster=slurm, tenant=tenant) == ["grp-protein"]
    assert tenant_limits(tenant=tenant, cluster=slurm).users == ["grp-protein"]  # not the service user


@pytest.mark.parametrize("template", ["{tenant}", "x-{tenant}"])
def test_an_account_that_would_be_root_the_service_user_or_no_name_is_refused(
    slurm, tenant, member, client_for, grant, template
):
    ClusterAccount.objects.create(tenant=tenant, cluster=slurm, username="gpuportal")
    answer = submit(client_for(member))
    assert answer.status_code == 400
    problem = answer.json()
    assert problem["code"] == "invalid" and list(problem["errors"]) == ["cluster"]
    assert "protein-lab has no usable cluster account on HPC" in problem["errors"]["cluster"][0]
    ClusterAccount.objects.filter(tenant=tenant).update(username="root")
    assert submit(client_for(member)).status_code == 400
    ClusterAccount.objects.filter(tenant=tenant).delete()
    slurm.tenant_identity_template = template + "-" + "x" * 30  # too long for a POSIX user name
    slurm.save()
    assert submit(client_for(member)).json()["errors"]["cluster"]
    assert tenant_identities(cluster=slurm, tenant=tenant) == []
    assert not Job.objects.exists()


def test_per_user_a_researcher_without_a_cluster_username_is_refused_by_name(
    slurm, tenant, member, client_for, grant
):
    slurm.job_identity = JobIdentity.USER
    slurm.save()
    answer = submit(client_for(member))
    assert answer.status_code == 400
    assert answer.json()["errors"]["cluster"] == [
        "HPC runs jobs as your own cluster username, and your profile names none: a platform admin sets it up."
    ]
    Profile.objects.create(user=member, cluster_username="mmember")
    done = submit(client_for(member))
    assert done.status_code == 201
    assert Job.objects.get(pk=done.json()["id"]).cluster_user == "mmember"
    colleague = join(tenant, "colleague", Role.MEMBER)
    Profile.objects.create(user=colleague, cluster_username="ccolleague")
    assert tenant_identities(cluster=slurm, tenant=tenant) == ["ccolleague", "mmember"]


def test_another_tenants_cluster_username_is_not_this_tenants_identity(slurm, tenant, other_tenant, outsider):
    slurm.job_identity = JobIdentity.USER
    slurm.save()
    Profile.objects.create(user=outsider, cluster_username="outsider1")
    assert tenant_identities(cluster=slurm, tenant=tenant) == []
    assert tenant_identities(cluster=slurm, tenant=other_tenant) == ["outsider1"]


def test_the_team_page_says_which_accounts_are_ready_missing_or_unchecked(web, slurm, tenant, viewer):
    page = web(viewer).get("/t/protein-lab/team/").content.decode()
    assert 'id="cluster-accounts"' in page and "<code>protein-lab</code>" in page
    assert 'data-ok="unknown"' in page and "Not checked yet" in page
    identities_record(cluster=slurm, problems={"protein-lab": "no user protein-lab on the login node"})
    page = web(viewer).get("/t/protein-lab/team/").content.decode()
    assert 'data-ok="no"' in page and "Missing on the cluster" in page
    assert "login node" not in page  # the check's own words are for admins
    identities_record(cluster=slurm, problems={"protein-lab": ""})
    assert 'data-ok="yes"' in web(viewer).get("/t/protein-lab/team/").content.decode()
    assert IdentityCheck.objects.get(cluster=slurm, username="protein-lab").checked_at <= timezone.now()


def test_in_the_browser_a_member_reads_the_missing_account(live_server, slurm, tenant, member):
    identities_record(cluster=slurm, problems={"protein-lab": "no user protein-lab on the login node"})
    with browser_page() as page:
        log_in(page, live_server.url, "member")
        page.goto(f"{live_server.url}/t/protein-lab/team/")
        card = page.locator("#cluster-accounts")
        expect(card.get_by_role("heading", name="Cluster accounts")).to_be_visible()
        row = card.locator("tr.cluster-account")
        expect(row).to_have_count(1)
        expect(row).to_contain_text("HPC")
        expect(row).to_contain_text("protein-lab")
        expect(row).to_contain_text("Missing on the cluster")
        screenshot(page, "team-cluster-accounts")


@pytest.mark.parametrize(
    ("template", "ok"),
    [("{tenant}", True), ("pt-{tenant}", True), ("jobs", False), ("{tenant}-{tenant}", False),
     ("{tenant:.3}", False), ("{tenant!r}", False), ("{0}", False), ("{", False), ("Upper-{tenant}", False)],
)  # fmt: skip
def test_a_template_is_plain_text_around_one_bare_tenant(slurm, template, ok):
    from django.core.exceptions import ValidationError

    slurm.tenant_identity_template = template
    if ok:
        slurm.full_clean()
    else:
        with pytest.raises(ValidationError) as caught:
            slurm.full_clean()
        assert "tenant_identity_template" in caught.value.message_dict


def test_a_slurm_cluster_needs_an_absolute_scratch_root(slurm):
    from django.core.exceptions import ValidationError

    for root in ("", "portal-jobs", "/shared/../etc"):
        slurm.scratch_root = root
        with pytest.raises(ValidationError) as caught:
            slurm.full_clean()
        assert list(caught.value.message_dict) == ["scratch_root"]


def test_no_two_tenants_share_an_account_and_no_two_researchers_a_username(
    slurm, tenant, other_tenant, member, outsider
):
    from django.db import IntegrityError, transaction

    # other-team's own account takes the name protein-lab's template would give: it wins, and
    # protein-lab has no usable account until it gets one of its own
    ClusterAccount.objects.create(tenant=other_tenant, cluster=slurm, username="protein-lab")
    assert job_identity_of(cluster=slurm, tenant=other_tenant, user=outsider) == "protein-lab"
    assert job_identity_of(cluster=slurm, tenant=tenant, user=member) is None
    with transaction.atomic(), pytest.raises(IntegrityError):
        ClusterAccount.objects.create(tenant=tenant, cluster=slurm, username="protein-lab")
    Profile.objects.create(user=member, cluster_username="shared")
    with transaction.atomic(), pytest.raises(IntegrityError):
        Profile.objects.create(user=outsider, cluster_username="shared")
    Profile.objects.create(user=outsider, cluster_username="")  # none is no clash


def test_a_job_from_before_identities_is_the_service_users_to_the_orphan_check(slurm):
    """Jobs submitted before jobs ran as identities record none (cluster_user ""): they ran as the
    cluster's SSH user, and the orphan check must not take them for someone else's."""
    from clusters.backends.base import SchedulerJob
    from jobs.services.cleanup import scheduler_job_is_ours

    token = "a" * 32
    legacy = ("RUNNING", slurm.pk, "41", "protein-lab", "")
    assert scheduler_job_is_ours(
        SchedulerJob("41", token, "protein-lab", "RUNNING", user="gpuportal"), legacy, slurm
    )
    assert not scheduler_job_is_ours(
        SchedulerJob("41", token, "protein-lab", "RUNNING", user="pt-x"), legacy, slurm
    )
    current = ("RUNNING", slurm.pk, "42", "protein-lab", "protein-lab")
    assert scheduler_job_is_ours(
        SchedulerJob("42", token, "protein-lab", "RUNNING", user="protein-lab"), current, slurm
    )
    assert not scheduler_job_is_ours(
        SchedulerJob("42", token, "protein-lab", "RUNNING", user="gpuportal"), current, slurm
    )
    assert not scheduler_job_is_ours(
        SchedulerJob("42", token, "other-team", "RUNNING", user="protein-lab"), current, slurm
    )
