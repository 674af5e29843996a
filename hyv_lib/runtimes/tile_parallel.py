"""VAE tile-parallel decode across torch.distributed ranks, reusing diffusers' own tiling and blending."""

from __future__ import annotations

import torch
import torch.distributed as dist


class _NotTileWise(Exception):
    """The VAE calls its decoder with more than one tile tensor (CogVideoX's carries a convolution cache from one
    frame batch to the next): its tiles are not independent calls, so they cannot be spread over ranks."""


class _TileDecoder(torch.nn.Module):
    """Stands in for ``vae.decoder`` during diffusers' own ``decode``: records the tiles it is asked to decode
    (returning zeros of the right shape), or replays decoded tiles in the same order."""

    def __init__(self, vae, replay: list[torch.Tensor] | None = None):
        super().__init__()
        # None on a VAE whose config does not name them: its decoder calls are not tile-wise (forward refuses them)
        self.spatial = vae.config.get("spatial_compression_ratio")
        self.temporal = vae.config.get("temporal_compression_ratio")
        self.out_channels = vae.config.get("out_channels")
        self.tiles: list[torch.Tensor] = []
        self.replay = replay

    def output_shape(self, tile: torch.Tensor) -> tuple[int, ...]:
        b, _, t, h, w = tile.shape
        return (b, self.out_channels, (t - 1) * self.temporal + 1, h * self.spatial, w * self.spatial)

    def forward(self, tile: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if args or kwargs or self.spatial is None or self.temporal is None:
            raise _NotTileWise
        self.tiles.append(tile)
        if self.replay is None:
            return tile.new_zeros(self.output_shape(tile))
        out = self.replay[len(self.tiles) - 1]
        if out.shape != self.output_shape(tile):  # the replay must follow the recorded order
            raise RuntimeError(f"tile {len(self.tiles) - 1}: replayed {tuple(out.shape)}, "
                               f"expected {self.output_shape(tile)}")
        return out


@torch.no_grad()
def tile_parallel_decode(vae, z: torch.Tensor, group=None, timeline: list | None = None) -> torch.Tensor:
    """``vae.decode(z).sample`` with spatial tiling, the tiles spread round-robin over the ranks of
    ``group`` (default: WORLD); every rank returns the full decoded video [B, 3, F, H, W].

    diffusers' ``decode`` runs three times, taking whatever tiling path the VAE class takes (spatial tiles, and
    temporal chunks of them where the class has them, as HunyuanVideo's VAE does): once with a recording stand-in for
    the decoder (which tile, in which order), then each rank decodes all of its own tiles and only then exchanges
    them with the others (one broadcast per tile, in order), then a replay feeds the decoded tiles to diffusers' own
    blending. So the ranks decode at the same time, and the result equals the single-process tiled decode. A video
    of one tile, one process, or a VAE whose decoder calls are not independent tiles (CogVideoX's carry a
    convolution cache from one frame batch to the next) decode whole on every rank: the same result, not spread.
    ``z`` is already divided by the scaling factor, as ``vae.decode`` expects. ``timeline``, if given, receives
    one ``(tile index, start, end)`` per tile this rank decoded (``time.perf_counter`` seconds).
    """
    import time

    world = dist.get_world_size(group) if dist.is_initialized() else 1
    rank = dist.get_rank(group) if dist.is_initialized() else 0
    vae.enable_tiling()
    if world == 1:
        return vae.decode(z).sample
    decoder = vae.decoder
    try:
        recorder = _TileDecoder(vae)
        vae.decoder = recorder
        try:
            vae.decode(z)
        except _NotTileWise:
            recorder.tiles = []
        tiles = recorder.tiles
        if len(tiles) <= 1:  # one tile, or not tile-wise: nothing to spread
            vae.decoder = decoder
            return vae.decode(z).sample
        decoded: list[torch.Tensor | None] = [None] * len(tiles)
        dist.barrier(group=group)  # start together, so that the decode phases overlap from the first tile
        for index in range(rank, len(tiles), world):  # this rank's share, with no collective in between
            start = time.perf_counter()
            decoded[index] = decoder(tiles[index])
            if timeline is not None:
                timeline.append((index, start, time.perf_counter()))
        for index, tile in enumerate(tiles):  # then one exchange: every tile from its owner to all ranks
            owner = index % world
            if decoded[index] is None:
                decoded[index] = tile.new_empty(recorder.output_shape(tile))
            # broadcast's src is a global rank; map the group rank to it
            src = dist.get_global_rank(group, owner) if group is not None else owner
            dist.broadcast(decoded[index], src=src, group=group)
        vae.decoder = _TileDecoder(vae, replay=decoded)
        return vae.decode(z).sample
    finally:
        vae.decoder = decoder
