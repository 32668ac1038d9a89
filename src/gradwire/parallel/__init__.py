"""Tensor parallelism: layers split over torch.distributed process groups, in 1-D (Megatron-LM),
2-D (SUMMA) and 2.5-D (SUMMA2.5-LM), and a transformer language model built from them.

The one package besides the transports that imports torch.distributed: its whole point is process
groups. Algorithms never import it; the run builds a :class:`~gradwire.parallel.mesh.Mesh` and each
rank's model shard here, and gradwire's data-parallel algorithms then see the shard as their
(flat) model. See docs/tensor_parallel.md.
"""
