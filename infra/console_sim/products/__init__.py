"""Products of the local cloud, each a :class:`~infra.console_sim.service.Product` registry."""
from __future__ import annotations

from ..service import Product
from . import actiontrail, ecs, oss, ram, vpc


def all_products() -> dict[str, Product]:
    """Every product by ActionTrail serviceName (``Ecs``, ``Vpc``, ``Ram``, ``Actiontrail``, ``Oss``)."""
    return {p.name: p for p in (ecs.PRODUCT, vpc.PRODUCT, ram.PRODUCT, actiontrail.PRODUCT,
                                oss.PRODUCT)}


def rpc_products() -> dict[str, Product]:
    """The RPC-style products by API version, which is how a request names its product. OSS
    speaks its own REST protocol and is not reachable over RPC."""
    return {p.version: p for p in (ecs.PRODUCT, vpc.PRODUCT, ram.PRODUCT, actiontrail.PRODUCT)}
