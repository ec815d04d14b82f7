"""`gpuportal`: the portal's REST API from the command line (docs/cli.md).

Exit codes: 0 done; 1 the job followed (`submit --wait`, `logs -f`) ended other than COMPLETED;
2 a usage error (bad arguments, an invalid job file, not logged in); 3 an API error (any 4xx or
5xx, or no answer); 4 `--timeout` (or the reconnects allowed) ran out before the job ended;
130 interrupted.

The group and what its commands share are in app.py, the commands in commands/: importing them
here registers them on the group.
"""

from __future__ import annotations

import click

from gpuportal.app import app
from gpuportal.commands import account, catalog, jobs  # noqa: F401  (they register their commands)
from gpuportal.i18n import _

# --- completion ------------------------------------------------------------------------------------


@app.command(
    short_help=_("Print the shell completion script."),
    help=_(
        "Print the completion script for bash, zsh or fish. Install it once:\n\n"
        "bash: gpuportal completion bash > ~/.local/share/bash-completion/completions/gpuportal\n\n"
        "zsh: gpuportal completion zsh > ~/.zfunc/_gpuportal (with fpath+=~/.zfunc before compinit "
        "in ~/.zshrc)"
    ),
)
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell) -> None:
    from click.shell_completion import get_completion_class

    complete = get_completion_class(shell)
    assert complete is not None
    click.echo(complete(app, {}, "gpuportal", "_GPUPORTAL_COMPLETE").source())


def main() -> None:
    app(prog_name="gpuportal")


if __name__ == "__main__":  # pragma: no cover
    main()
