"""``mooncake.mooncake_config``: Mooncake's store and engine settings from a JSON file
(``MOONCAKE_CONFIG_PATH``) or the ``MOONCAKE_*`` environment, as Mooncake's module reads
them, for the programs that build their ``setup(...)`` arguments from it.

The fields, their defaults, the variable names and the checks are Mooncake's:

========================== ============================== =========================
field                      environment                    default
========================== ============================== =========================
local_hostname             MOONCAKE_LOCAL_HOSTNAME        ``"localhost"``
metadata_server            MOONCAKE_TE_META_DATA_SERVER   ``"P2PHANDSHAKE"``
global_segment_size        MOONCAKE_GLOBAL_SEGMENT_SIZE   3.125 GiB (``"4gb"``, ``"512mb"``, bytes)
local_buffer_size          MOONCAKE_LOCAL_BUFFER_SIZE     1 GiB
protocol                   MOONCAKE_PROTOCOL              ``"tcp"`` (lower-cased)
device_name                MOONCAKE_DEVICE                ``""``
master_server_address      MOONCAKE_MASTER                required
enable_ssd_offload         MOONCAKE_OFFLOAD_ENABLED       False
ssd_offload_path           MOONCAKE_OFFLOAD_FILE_STORAGE_PATH ``""``
tenant_id                  MOONCAKE_TENANT_ID             ``"default"``
enable_client_http_server  MOONCAKE_ENABLE_CLIENT_HTTP_SERVER False
client_http_port           MOONCAKE_CLIENT_HTTP_PORT      9300
========================== ============================== =========================

A bad value is a ``ValueError`` that names it. On Moongate, ``master_server_address`` is
the REST master (``host:port`` or an ``http(s)://`` URL); ``setup`` refuses what the store
does not do (SSD offload, other tenants) with its return code.
"""

import json
import logging
import os
from dataclasses import dataclass
from typing import Optional

logger = logging.getLogger(__name__)

DEFAULT_GLOBAL_SEGMENT_SIZE = 3355443200  # 3.125 GiB
DEFAULT_LOCAL_BUFFER_SIZE = 1073741824  # 1 GiB
DEFAULT_CLIENT_HTTP_PORT = 9300

# Longest suffix first: "mb" before "b".
_UNITS = (("kb", 1 << 10), ("mb", 1 << 20), ("gb", 1 << 30), ("tb", 1 << 40),
          ("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30), ("t", 1 << 40), ("b", 1))

# Transports Mooncake names; another value is passed on with a warning (the engine decides).
KNOWN_PROTOCOLS = frozenset({
    "tcp", "rdma", "efa", "nvmeof", "nvlink", "musa", "nvlink_intra", "hip", "barex",
    "cxl", "ascend", "ub", "ubshmem", "maca", "sunrise_link", "rpc_only",
})

_REQUIRED = ("local_hostname", "metadata_server", "master_server_address")


def _size(value) -> int:
    """Bytes from an int or a string with an optional unit (``"4gb"``, ``"1.5g"``)."""
    if isinstance(value, bool):
        raise ValueError(f"Invalid size: {value!r}")
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    if not text:
        raise ValueError("Invalid size: empty string")
    for unit, scale in _UNITS:
        if text.endswith(unit):
            number = text[: -len(unit)].strip()
            if not number:
                raise ValueError(f"Invalid size {value!r}: no number before {unit!r}")
            return int(float(number) * scale)
    return int(float(text))


def _flag(value) -> bool:
    """A boolean from a bool, a number or the usual words; anything else is an error."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if value is None:
        return False
    text = str(value).strip().lower()
    if text in ("", "false", "0", "no", "off", "disable"):
        return False
    if text in ("true", "1", "yes", "on", "enable"):
        return True
    raise ValueError(f"Invalid boolean value: {value!r}")


@dataclass
class MooncakeConfig:
    """Mooncake's settings (see the module doc for each field)."""

    local_hostname: str
    metadata_server: str
    global_segment_size: int
    local_buffer_size: int
    protocol: str
    device_name: Optional[str]
    master_server_address: str
    enable_ssd_offload: bool = False
    ssd_offload_path: str = ""
    tenant_id: str = "default"
    enable_client_http_server: bool = False
    client_http_port: int = DEFAULT_CLIENT_HTTP_PORT

    def __post_init__(self):
        if not isinstance(self.protocol, str) or not self.protocol.strip():
            raise ValueError(f"Invalid protocol: {self.protocol!r} (e.g. 'tcp' or 'rdma')")
        self.protocol = self.protocol.strip().lower()
        if self.protocol not in KNOWN_PROTOCOLS:
            logger.warning("Unrecognised protocol %r, passed on unchanged (known: %s)",
                           self.protocol, ", ".join(sorted(KNOWN_PROTOCOLS)))
        for name in ("global_segment_size", "local_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"Invalid {name}: {getattr(self, name)} (must be >= 0)")
        for name in _REQUIRED:
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"Config field {name!r} must be a non-empty string, got {value!r}")

    @staticmethod
    def from_file(file_path: str) -> "MooncakeConfig":
        """The settings of a JSON file; ``local_hostname``, ``metadata_server`` and
        ``master_server_address`` are required."""
        with open(file_path) as f:
            c = json.load(f)
        for name in _REQUIRED:
            if name not in c:
                raise ValueError(f"Missing required config field: {name}")
        path, tenant = c.get("ssd_offload_path"), c.get("tenant_id")
        return MooncakeConfig(
            local_hostname=c["local_hostname"],
            metadata_server=c["metadata_server"],
            global_segment_size=_size(c.get("global_segment_size", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=_size(c.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=c.get("protocol", "tcp"),
            device_name=c.get("device_name", ""),
            master_server_address=c["master_server_address"],
            enable_ssd_offload=_flag(c.get("enable_ssd_offload", False)),
            ssd_offload_path="" if path is None else str(path),
            tenant_id="default" if tenant is None else str(tenant),
            enable_client_http_server=_flag(c.get("enable_client_http_server", False)),
            client_http_port=int(c.get("client_http_port", DEFAULT_CLIENT_HTTP_PORT)),
        )

    @staticmethod
    def load_from_env() -> "MooncakeConfig":
        """The file ``MOONCAKE_CONFIG_PATH`` names, else the ``MOONCAKE_*`` variables
        (``MOONCAKE_MASTER`` required)."""
        path = os.getenv("MOONCAKE_CONFIG_PATH")
        if path is not None:
            return MooncakeConfig.from_file(path)
        if not os.getenv("MOONCAKE_MASTER"):
            raise ValueError("Neither the environment variable 'MOONCAKE_CONFIG_PATH' "
                             "nor 'MOONCAKE_MASTER' is set.")
        env = os.getenv
        return MooncakeConfig(
            local_hostname=env("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            metadata_server=env("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"),
            global_segment_size=_size(env("MOONCAKE_GLOBAL_SEGMENT_SIZE", DEFAULT_GLOBAL_SEGMENT_SIZE)),
            local_buffer_size=_size(env("MOONCAKE_LOCAL_BUFFER_SIZE", DEFAULT_LOCAL_BUFFER_SIZE)),
            protocol=env("MOONCAKE_PROTOCOL", "tcp"),
            device_name=env("MOONCAKE_DEVICE", ""),
            master_server_address=env("MOONCAKE_MASTER"),
            enable_ssd_offload=_flag(env("MOONCAKE_OFFLOAD_ENABLED", "false")),
            ssd_offload_path=env("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            tenant_id=env("MOONCAKE_TENANT_ID", "default"),
            enable_client_http_server=_flag(env("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "false")),
            client_http_port=int(env("MOONCAKE_CLIENT_HTTP_PORT", DEFAULT_CLIENT_HTTP_PORT)),
        )
