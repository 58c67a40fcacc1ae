"""attention-distill: the shared machinery of the pipeline (stages/ holds the steps)."""

import logging as _logging

# transformers imports torchao (installed with executorch) on first model use; torchao then warns about each
# optional CUDA kernel library it cannot load on this CPU build, and torch's pytree about its Enum registrations.
# Neither concerns this product: keep them off every command's output.
_logging.getLogger("torchao").setLevel(_logging.ERROR)
_logging.getLogger("torch.utils._pytree").setLevel(_logging.ERROR)
