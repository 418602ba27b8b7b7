"""Where a running process's config comes from, and how it changes: ``--config`` (read again on
SIGHUP, validate-then-swap), or the named configs of ``--config-dir`` (``ConfigFollower``: the
node label and the directory, followed on threads of their own)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from labeller.model.config import ConfigError
from labeller.base.log import get_logger

if TYPE_CHECKING:
    from labeller.process.follow import ConfigFollower
    from labeller.host.machine import Host

log = get_logger(__name__)


class ConfigSource:
    """The config of ``host``: ``reload`` on SIGHUP, ``apply`` when the follower saw a change."""

    def __init__(self, host: Host, config_path: Path | None = None, follower: ConfigFollower | None = None) -> None:
        self.host, self.config_path, self.follower = host, config_path, follower

    def reload(self) -> bool:
        """SIGHUP: the named config again (with a follower: the files are looked at now), else ``--config``
        again. A file that does not load is logged once and the config in force stays: False, and
        nothing else changes."""
        if self.follower is not None:
            self.follower.check_files(notify=False)
            self.apply()
            return True
        if self.config_path is None:
            return True  # the defaults, or a simulated profile's own config (read again with the profile)
        try:
            config = self.host.read_config(self.config_path)
        except ConfigError as exc:
            log.error("config reload failed, keeping the old config", reason="bad-config", error=str(exc))
            return False
        self.host.config = config
        log.info("config reloaded", reason="sighup", config=str(self.config_path))
        return True

    def apply(self) -> bool:
        """Put the follower's selection in force; True when what is in force changed (the config, or
        the named config's state, which the labels report)."""
        if self.follower is None:
            return False
        before = self.host.selection
        self.follower.apply(self.host)
        return self.host.selection != before
