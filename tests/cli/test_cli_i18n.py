"""The CLI in Simplified Chinese when the locale says zh (LANGUAGE, LC_ALL, LC_MESSAGES, LANG, the
first one set), in English otherwise: its help, tables, errors and click's own messages; the
catalog complete and compiled; the wheel carrying it and the `gpuportal` command."""

import subprocess
import sys
import zipfile

import pytest

from tests.cli_support import job_file, rows_of
from tests.conftest import ROOT

ZH = {"LANG": "zh_CN.UTF-8"}


@pytest.mark.django_db(transaction=True)
def test_help_tables_and_errors_in_chinese(member_cli, member, make_job):
    help_text = member_cli.run("--help", **ZH).stdout
    assert help_text.startswith("用法: gpuportal [OPTIONS] COMMAND [ARGS]...")
    assert (
        "命令:" in help_text and "  ls          列出作业。" in help_text and "显示此帮助并退出。" in help_text
    )

    whoami = member_cli.run("whoami", **ZH).stdout
    rows = [line.split() for line in whoami.splitlines()]
    assert ["用户名", "member"] in rows and ["令牌来源", "环境变量"] in rows and ["平台管理员", "否"] in rows
    assert ["租户", "名称", "角色"] in rows and ["protein-lab", "Protein", "Lab", "member"] in rows
    quota = rows_of(member_cli.run("quota", "--all", **ZH).stdout)
    assert quota[0] == [
        "ID",
        "场景",
        "GPU",
        "型号",
        "使用中",
        "GPU",
        "剩余",
        "GPU",
        "时数",
        "已用",
        "预留",
        "截止",
        "开始",
        "生效",
    ]
    assert quota[1][-1] == "是"  # active: yes

    bad_file = member_cli.run("submit", "-f", str(job_file(member_cli.home, gpus="two", color="blue")), **ZH)
    assert bad_file.rc == 2
    assert sorted(bad_file.stderr.splitlines()[1:]) == [
        "  color: 未知字段。作业可用的字段：tenant, scenario, gpu_model, gpus, nodes, share, mig_profile, "
        "gpu_memory_mib, gpu_cores_pct, walltime_minutes, name, priority, env, script, script_file, template, "
        "parameters, cluster, partition, preemptible, max_restarts, restart_exit_codes。",
        "  gpus: 必须是整数。",
    ]
    assert bad_file.stderr.startswith("错误：") and bad_file.stderr.splitlines()[0].endswith("无法发送：")

    missing = member_cli.run("submit", **ZH)
    assert missing.rc == 2 and "错误：缺少选项 '--file' / '-f'" in missing.stderr  # click's own message
    not_found = member_cli.run("show", "999999", **ZH)
    assert not_found.rc == 3 and not_found.stderr.startswith("错误：not_found（HTTP 404）：")
    cancelled = member_cli.run("cancel", str(make_job(member, state="COMPLETED").pk), **ZH)
    assert cancelled.rc == 3 and cancelled.stderr.startswith("错误：conflict（HTTP 409）：")
    assert member_cli.run("logout", **ZH).stdout == "尚未登录：没有保存任何内容。\n"


@pytest.mark.parametrize(
    ("env", "chinese"),
    [
        ({"LANG": "zh_CN.UTF-8"}, True),
        ({"LANG": "zh_TW.UTF-8"}, True),
        ({"LANG": "en_US.UTF-8", "LC_MESSAGES": "zh_CN.UTF-8"}, True),
        ({"LANG": "zh_CN.UTF-8", "LC_ALL": "en_US.UTF-8"}, False),
        ({"LANG": "C.UTF-8", "LANGUAGE": "zh_CN:en"}, True),
        ({"LANG": "fr_FR.UTF-8"}, False),
    ],
)
def test_the_locale_decides(cli, env, chinese):
    answer = cli.run("whoami", **env)
    assert answer.rc == 2
    expected = "错误：尚未登录" if chinese else "Error: Not logged in"
    assert answer.stderr.startswith(expected), answer


def test_the_catalog_is_complete_and_compiled():
    """Every message of the package and of click has its translation, and the .mo says the same
    as the .po (cli/messages.py --check)."""
    check = subprocess.run([sys.executable, "cli/messages.py", "--check"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert check.returncode == 0, check.stderr


def test_the_wheel_carries_the_catalog_and_the_command(tmp_path):
    """A wheel built from pyproject.toml and cli/ alone (what pip install from git builds)."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    subprocess.run(["cp", "-r", str(ROOT / "cli"), str(source / "cli")], check=True)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", str(source),
         "-w", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "out").glob("gpu_portal-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert {"gpuportal/locale/zh_Hans/LC_MESSAGES/gpuportal.mo", "gpuportal/locale/zh_Hans/LC_MESSAGES/gpuportal.po",
            "gpuportal/main.py", "gpuportal/client.py", "gpuportal/commands/jobs.py"} <= names  # fmt: skip
    assert "gpuportal = gpuportal.main:app" in entry_points
    for requirement in ("httpx~=0.29", "click~=8.5", "rich~=15.0", "PyYAML~=6.0", "platformdirs~=4.14"):
        assert f'Requires-Dist: {requirement}; extra == "cli"' in metadata
