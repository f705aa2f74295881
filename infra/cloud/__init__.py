"""The one way the project talks to a cloud: the official Alibaba Cloud SDKs, configured by
endpoint. ``CloudConfig(endpoint="127.0.0.1:18080", protocol="http")`` is the local cloud;
``CloudConfig(endpoint=None, region_id="cn-hangzhou")`` is the real Alibaba Cloud."""
from .client import CloudClient, CloudConfig, Credentials

__all__ = ["CloudClient", "CloudConfig", "Credentials"]
