"""Tensor parallelism: layers split over torch.distributed process groups, in 1-D (Megatron-LM),
2-D (SUMMA) and 2.5-D (SUMMA2.5-LM), and a transformer language model built from them.

Its whole point is process groups, yet it calls no torch.distributed function itself: the groups
and their counted collectives come from :mod:`gradwire.transports.groups`. Algorithms never import
it; the run builds a :class:`~gradwire.parallel.mesh.Mesh` and each rank's model shard here, and
gradwire's data-parallel algorithms then see the shard as their (flat) model. See docs/tensor_parallel.md.
"""
