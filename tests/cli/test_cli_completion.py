"""Shell completion: `gpuportal completion bash|zsh` prints click's scripts; the bash one, sourced
in a real bash, completes commands, options, job states and (asking the portal) tenant slugs;
the zsh one speaks the same protocol (zsh_complete), checked through the command itself, and
parses in zsh."""

import os
import subprocess

import pytest

from tests.conftest import VENV_BIN

DB = pytest.mark.django_db(transaction=True)  # the tests that make rows; the others touch no table

PROBE = """
source {script}
complete_words() {{
    COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMPREPLY=()
    _gpuportal_completion gpuportal
    echo "${{COMPREPLY[*]}}"
}}
complete_words gpuportal lo
complete_words gpuportal ls --st
complete_words gpuportal ls --state RU
complete_words gpuportal quota --tenant ""
complete -p gpuportal
"""


@DB
def test_bash_completes_commands_options_states_and_tenants(member_cli, member):
    script = member_cli.run("completion", "bash")
    assert script.rc == 0 and "complete -o nosort -F _gpuportal_completion gpuportal" in script.stdout
    path = member_cli.home / "gpuportal.bash"
    path.write_text(script.stdout)
    assert subprocess.run(["bash", "-n", str(path)], timeout=10).returncode == 0
    env = member_cli.env(PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    shell = subprocess.run(["bash", "-c", PROBE.format(script=path)], env=env, capture_output=True, text=True,
                           timeout=30)  # fmt: skip
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.splitlines() == [
        "login logout logs",
        "--state",
        "RUNNING",
        "protein-lab",  # from the portal: GET /me/
        "complete -o nosort -F _gpuportal_completion gpuportal",
    ]


@DB
def test_zsh_script_and_protocol(member_cli, member):
    script = member_cli.run("completion", "zsh").stdout
    assert script.startswith("#compdef gpuportal") and "compdef _gpuportal_completion gpuportal" in script
    assert "_GPUPORTAL_COMPLETE=zsh_complete gpuportal" in script
    path = member_cli.home / "_gpuportal"
    path.write_text(script)
    # zsh itself parses it (.ci/run installs Debian's zsh)
    assert subprocess.run(["zsh", "-n", str(path)], timeout=10).returncode == 0
    # what the script asks the command, and the triples (type, value, help) it reads back
    asked = member_cli.run(_GPUPORTAL_COMPLETE="zsh_complete", COMP_WORDS="gpuportal lo", COMP_CWORD="1")
    triples = asked.stdout.splitlines()
    assert asked.rc == 0 and triples[0::3] == ["plain"] * 3 and triples[1::3] == ["login", "logout", "logs"]
    assert triples[2] == "Log in and store a token (mode 0600)."
    tenants = member_cli.run(
        _GPUPORTAL_COMPLETE="zsh_complete", COMP_WORDS="gpuportal ls --tenant p", COMP_CWORD="3"
    )
    assert tenants.stdout.splitlines() == ["plain", "protein-lab", "Protein Lab"]


def test_completion_takes_bash_zsh_or_fish(cli):
    assert cli.run("completion", "fish").rc == 0
    wrong = cli.run("completion", "tcsh")
    assert wrong.rc == 2 and "'tcsh' is not one of 'bash', 'zsh', 'fish'" in wrong.stderr
