"""Job templates: injection attempts stay inert. Every restricted string refuses shell syntax, free
text reaches the program as one literal argument each, and rendering always validates."""

from pathlib import Path

import pytest

from jobs.job_templates import TEMPLATES, TemplateInvalid, render_template
from tests.job_templates_support import (
    MINIMAL,
    SLURM_ENV,
    calls_of,
    invalid,
    run_script,
)

# --- Injection ----------------------------------------------------------------------------------


def payloads(marker: Path) -> list[str]:
    return [
        f"; touch {marker}",
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"' ; touch {marker} ; '",
        f'" ; touch {marker} ; "',
        f"$(echo pwned > {marker})",
        f"&& touch {marker} #",
        f"| touch {marker}",
        "*",
        "~root",
        "${IFS}x",
        "",
    ]


SHELL_BITS = [";", "$(id)", "`id`", "a\nb", "'", '"', "a b", "|", "&", ">", "\\", "x\n"]


@pytest.mark.parametrize("slug", list(TEMPLATES))
def test_schema_refuses_shell_syntax_in_every_restricted_string(slug):
    schema = TEMPLATES[slug].parameters_schema
    checked = 0
    for name, prop in schema["properties"].items():
        if prop.get("type") != "string":
            continue
        for bit in SHELL_BITS:
            params = {**MINIMAL[slug], name: "ok" + bit}
            assert f"parameters.{name}" in invalid(slug, params), (name, bit)
            checked += 1
    assert checked


@pytest.mark.parametrize("slug", ["python", "torchrun", "horovod"])
@pytest.mark.parametrize(("kind", "nodes"), [("local", 1), ("kubernetes", 1), ("slurm", 1), ("slurm", 3)])
def test_free_text_arguments_arrive_as_one_literal_argument_each(slug, kind, nodes, tmp_path):
    if nodes > 1 and kind not in TEMPLATES[slug].multi_node_backends:
        nodes = 1
    marker = tmp_path / "marker"
    args = payloads(marker)
    script = render_template(
        slug, {"script": "train.py", "args": args}, nodes=nodes, gpus_per_node=2, backend_kind=kind
    )
    done, calls = run_script(script, tmp_path, env=SLURM_ENV)
    assert done.returncode == 0, done.stderr
    program = "torchrun" if slug == "torchrun" else "python3"
    (argv,) = calls_of(calls, program)
    assert argv[-len(args) - 1 :] == ["train.py", *args]
    assert not marker.exists()


def test_the_harness_would_catch_an_unquoted_value(tmp_path):
    # The check above means something only if an injected command would run here.
    marker = tmp_path / "marker"
    done, _ = run_script(f"#!/bin/bash\npython3 train.py $(touch {marker})\n", tmp_path)
    assert done.returncode == 0
    assert marker.exists()


def test_template_render_validates_on_its_own():
    # No way to a script skips validation: the method checks as render_template does.
    with pytest.raises(TemplateInvalid) as raised:
        TEMPLATES["python"].render(params={"script": "$(id)"}, nodes=1, gpus_per_node=1, backend_kind="local")
    assert list(raised.value.errors) == ["parameters.script"]
