"""How a compiled dropout pass applies a keep decision to a value ``v`` (each bitwise one of torch's CPU ops).

* :data:`MULTIPLY`: ``v * keep`` as ``torch.mul(v, bool_mask)`` computes it (``-v * 0 = -0``, ``inf * 0 = nan``);
* :data:`FILL`: ``v`` if kept, else ``+0`` (``masked_fill_(~mask, 0)``);
* :data:`RELU_FILL`: ``torch.relu(v)`` if kept (``-0`` and ``nan`` stay as they are), else ``+0``;
* :data:`KEEP`: the decision itself, into a boolean (``uint8``) array.

A leaf: :mod:`sparse_dist.dropout_kernel` (which loads numba only when it is asked to) and
:mod:`sparse_dist.dropout_compiled` (the numba kernels) both read these.
"""

MULTIPLY, FILL, RELU_FILL, KEEP = 0, 1, 2, 3
