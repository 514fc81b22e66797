"""``covenant network-setup``: the host's nftables table of a home, for a daemon that may not write it.

A root daemon installs a table of its own at start (:mod:`covenant.runtime.hostnet`). The systemd unit
runs the daemon as its own user without CAP_NET_ADMIN, so the unit runs this command as root before
it (``ExecStartPre=+``) and with ``--remove`` after it (``ExecStopPost=+``).
"""

from __future__ import annotations

import click

from covenant.cli._common import CliContext, echo, pass_cli, print_json, reports_errors
from covenant.errors import ConfigError

__all__ = ["network_setup"]


@click.command("network-setup")
@click.option("--remove", is_flag=True, help="Remove the home's table instead of writing it.")
@click.option("--json", "as_json", is_flag=True, help="Print {table, removed, gids, host_allow} as JSON.")
@pass_cli
@reports_errors
def network_setup(cli: CliContext, remove: bool, as_json: bool) -> None:
    """Write (or remove) the nftables table that keeps this home's agents off the host.

    Agents with network reach the world from a network namespace of their own; this table refuses
    whatever their gids send to an address of the host itself, except [isolation] host_allow and
    port 53 of the host's resolvers. Needs root (CAP_NET_ADMIN). Exit 0 when done, 2 when the
    configuration or nft refuses it.
    """
    from covenant.config import load_config
    from covenant.runtime import hostnet

    config = load_config(cli.home)
    name = hostnet.table_name(str((cli.home.state_dir).resolve()))
    if remove:
        hostnet.remove(name)
        document = {"table": name, "removed": True}
    else:
        if config.isolation.user is not None:
            import pwd

            gid = pwd.getpwnam(config.isolation.user).pw_gid
            gids = (gid, gid)
        else:
            gids = config.isolation.uid_range
        try:
            hostnet.install(hostnet.ruleset(name, gids, config.isolation.host_allow, hostnet.host_resolvers()))
        except OSError as exc:
            raise ConfigError(f"{exc} (run it as root)") from None
        document = {"table": name, "removed": False, "gids": list(gids), "host_allow": list(config.isolation.host_allow)}
    if as_json:
        print_json(document)
    elif remove:
        echo(f"removed nftables table inet {name}")
    else:
        echo(f"wrote nftables table inet {name}: agent gids {gids[0]}-{gids[1]} never reach the host"
             + (f" but {', '.join(config.isolation.host_allow)}" if config.isolation.host_allow else ""))
