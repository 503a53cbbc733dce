"""The rule modules, one per category of the study's taxonomy; importing registers them."""

from . import (  # noqa: F401
    c1_environment,
    c2_device,
    c3_libraries,
    c3_weight_tying,
    c4_lazy_tensor,
    c5_ops_numerics,
    c6_memory,
    c7_infrastructure,
)
