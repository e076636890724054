"""The Ray backend: batches built by actors on a Ray cluster, delivered to each rank in plan order.

``cluster`` connects (or says within seconds why it cannot) and sizes the pool; ``builders``
is the actor that builds planned batches and the pool the ranks of a job share; ``lease``
keeps that pool as long as the job has a rank (not the one that made it); ``loader`` is
:class:`RayLoader`, the rank's side: it plans, keeps a bounded window of batches in flight,
and rebuilds those a lost actor or node took with it. Ray is imported on first use only
(``pip install 'mmloader[ray]'``).
"""

from .loader import RAY_OPTIONS, RayLoader

__all__ = ["RAY_OPTIONS", "RayLoader"]
