"""Random-k sparsification with shared randomness: only the values and a seed travel.

The rand-k operator (e.g. Stich, Cordonnier, Jaggi 2018, "Sparsified SGD with memory", NeurIPS)
keeps k = ceil(ratio*n) elements chosen uniformly at random without replacement. Scaled by n/k it is
unbiased, and since each element is kept with probability k/n,
``E||C(x)||^2 = sum_j (n/k)^2 x_j^2 k/n = (n/k) ||x||^2``, so ``E||C(x) - x||^2 = (n/k - 1) ||x||^2``:
omega = n/k - 1, with equality.

The sender draws a 64-bit seed from its generator; both ends derive the same index set from it
(:func:`random_subset`, same torch version on both ends; drawn by a CPU generator whatever the
tensor's device, so a sender and a receiver on different devices agree, at the price of k indices
copied to the device). Wire format:
``[int64 seed, little-endian][k values, input dtype, in increasing index order]``:
``8 + k*itemsize`` bytes. Values travel unscaled (exact); the receiver multiplies by n/k.
"""

from __future__ import annotations

import torch

from gradwire.compress.base import REGISTRY, Compressor, Packet
from gradwire.compress.positions import check_finite, check_ratio, itemsize, keep_count, scatter
from gradwire.compress.wire import check_decodable, flat, make_packet, payload, read


def random_subset(n: int, k: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """A uniformly random k-subset of range(n), sorted, determined by ``seed``, on ``device``.

    ``randperm(n)`` costs O(n) (0.7 s for n = 25M), so for k <= n/2 we draw 2k indices with
    replacement and keep k of the distinct ones at random. The distinct set of iid uniform draws,
    given its size, is a uniform subset of that size (the law is invariant under permutations of
    range(n)), so the result is uniform. Too few distinct draws (rare) means a redraw with twice as
    many, which keeps uniformity.
    """
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    if k == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    if 2 * k > n:
        return torch.randperm(n, generator=g, device="cpu")[:k].sort().values.to(device)
    draws = 2 * k
    while True:
        distinct = torch.unique(torch.randint(n, (draws,), generator=g, device="cpu"))
        if distinct.numel() >= k:
            pick = torch.randperm(distinct.numel(), generator=g, device="cpu")[:k]
            return distinct[pick].sort().values.to(device)
        draws *= 2


@REGISTRY.register(
    "randk",
    help="random-k, scaled by n/k (unbiased); indices from a shared 64-bit seed, only values travel",
    params={"ratio": "fraction of elements kept, in (0, 1]"},
)
class RandK(Compressor):
    """Random-k sparsification; unbiased, ``omega = n/k - 1``."""

    name = "randk"
    unbiased = True
    stochastic = True

    def __init__(self, *, ratio: float = 0.01):
        self.ratio = check_ratio(ratio)

    def spec(self) -> str:  # not spec_of: repr keeps "ratio=1.0" as earlier records have it
        return f"randk:ratio={self.ratio!r}"

    def omega(self, numel: int) -> float:
        return numel / keep_count(self.ratio, numel) - 1 if numel else 0.0

    def nbytes(self, numel: int, dtype: torch.dtype = torch.float32) -> int:
        return 8 + keep_count(self.ratio, numel) * itemsize(dtype)

    def encode(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> Packet:
        xf = flat(x)
        n = xf.numel()
        check_finite(xf, self.name)  # also the elements that are not sent: they stay in any residual
        # the seed comes from the caller's generator, on that generator's device
        device = generator.device if generator is not None else xf.device
        seed = torch.empty(1, dtype=torch.int64, device=device).random_(-(2**63), None, generator=generator)
        k = keep_count(self.ratio, n)
        values = xf[random_subset(n, k, int(seed), xf.device)]
        if k and x.dtype == torch.float16:  # decoded: values times n/k (bfloat16 has float32's range)
            check_decodable(values.abs().max().to(torch.float64).view(1) * (n / k), x.dtype, self.name,
                            "keep a larger ratio (the values travel scaled by n/k)")
        seed = seed.to(xf.device)
        return make_packet(torch.cat([seed.view(torch.uint8), values.view(torch.uint8)]), x)

    def decode(self, packet: Packet) -> torch.Tensor:
        n, dtype = packet.numel, packet.dtype
        k = keep_count(self.ratio, n)
        buf = payload(packet, self.nbytes(n, dtype), self.name)
        index = random_subset(n, k, int(read(buf[:8], torch.int64)[0]), buf.device)
        values = read(buf[8:], dtype)
        return scatter(n, index, values, dtype, self.name, n / k if k else 1.0).reshape(packet.shape)
