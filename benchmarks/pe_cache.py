"""2-D axial RoPE table (64x64 positions, head dim 128): built on every call vs a PECache hit
(key construction included), same process. The ratio shows what a runner saves per forward."""

from __future__ import annotations

import numpy as np

from common import Row, best_of, env_note, print_rows
from rlx_runtime import PECache, PECacheKey

H = W = 64
HEAD_DIM = 128
THETA = 10000.0


def axial_rope(h: int, w: int, dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [h*w, dim]: half the rotary dims follow the row index, half the column index."""
    quarter = dim // 4
    inv = 1.0 / theta ** (np.arange(quarter, dtype=np.float64) / quarter)
    ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    ang = np.concatenate([ys.reshape(-1, 1) * inv, xs.reshape(-1, 1) * inv], axis=1)  # [h*w, dim/2]
    ang = np.concatenate([ang, ang], axis=1).astype(np.float32)
    return np.cos(ang), np.sin(ang)


def main() -> list[Row]:
    cache = PECache()

    def cached():
        key = PECacheKey("axial_rope").add_shape((H, W)).add(HEAD_DIM).add(THETA)
        return cache.get_or_create(key, lambda: np.stack(axial_rope(H, W, HEAD_DIM, THETA)))

    first = cached()
    assert np.array_equal(first, np.stack(axial_rope(H, W, HEAD_DIM, THETA)))
    t_hit = best_of(cached, number=200)
    t_build = best_of(lambda: axial_rope(H, W, HEAD_DIM, THETA), number=5)
    return [Row("pe_cache", "axial RoPE 64x64, dim 128: hit vs build", t_hit, t_build, "rebuild per call",
                "<= 1.0x", origin="no target was set (a62568b); a hit must at least beat a rebuild")]


if __name__ == "__main__":
    print(env_note())
    print_rows(main())
