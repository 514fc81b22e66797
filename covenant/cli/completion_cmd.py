"""``covenant completion bash|zsh|fish``: print the shell completion script (click's mechanism)."""

from __future__ import annotations

import click

__all__ = ["completion"]

_SHELLS = ("bash", "zsh", "fish")


@click.command()
@click.argument("shell", type=click.Choice(_SHELLS))
def completion(shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish).

    \b
    bash:  eval "$(covenant completion bash)"      in ~/.bashrc
    zsh:   eval "$(covenant completion zsh)"       in ~/.zshrc
    fish:  covenant completion fish > ~/.config/fish/completions/covenant.fish
    """
    from click.shell_completion import get_completion_class

    from covenant.cli.group import cli

    completer = get_completion_class(shell)
    assert completer is not None  # click ships all three
    click.echo(completer(cli, {}, "covenant", "_COVENANT_COMPLETE").source())
