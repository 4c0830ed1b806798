"""Format facts, in one place (spec/rlx-format.md and spec/rlxenc.md quote these)."""

from .codecs import CODECS

RLXBAKE_MAGIC = b"RLXBAKE1"
RLXENC_MAGIC = b"RLXENC01"
SCHEMA_VERSION = 2                 # what writers emit
READABLE_VERSIONS = (1, 2)         # 1 = graph only, 2 = graph + weight table
PREAMBLE_BYTES = 20                # magic (8) + u32 version + u64 header length
ALIGNMENT = 64                     # every tensor starts at a multiple of this file offset

# hard caps checked before allocating anything a header claims
MAX_HEADER_BYTES = 256 << 20
MAX_WEIGHTS = 1_000_000
MAX_NODES = 10_000_000
MAX_RANK = 16
MAX_DIM = 1 << 48
MAX_STR = 1 << 16
MAX_BODY_DEPTH = 16               # If/Loop/Scan bodies nested at most this deep (nodes: MAX_NODES in all)
HEADER_KEYS = ("graph", "weights", "meta", "digest_algo")  # the only top-level header keys
HEADER_BYTES_PER_CONTAINER = 8     # a header decodes to at most one map/array per this many bytes
HEADER_CONTAINER_ALLOWANCE = 4096  # ... plus this many (tiny headers)

PLAIN_ENCODINGS = ("f32", "f16", "bf16", "f64", "i64", "i32", "i16", "i8", "u8", "bool")
QUANT_ENCODINGS = {c.name: (c.block, c.nbytes) for c in CODECS.values()}  # block elems, block bytes (codecs.py)

# RLXENC01 key-derivation presets by name (their parameters: rlx_format.sealed.KDF_PROFILES)
KDF_PROFILE_NAMES = ("default", "fast", "strong")
