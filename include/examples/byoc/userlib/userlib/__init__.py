"""A team's own helpers, installed into the team's image: byte-level data blocks and a marker callback.

The BYOC example's dependency (include/examples/byoc): it is not in SAT's training image, so a
script that imports it runs only in the image built from the example's Containerfile.
"""

from userlib.callbacks import MarkerCallback
from userlib.data import ByteBlocks

__version__ = "0.1.0"
__all__ = ["ByteBlocks", "MarkerCallback", "__version__"]
