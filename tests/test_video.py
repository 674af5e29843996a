"""Stage-3 helpers: mp4 round trip, decoding, atomic writes."""

import os

import numpy as np
import pytest
import torch

from hyv_lib.base.files import atomic_path
from hyv_lib.models.families import get_preset
from hyv_lib.models.components import build_tiny_components
from hyv_lib.pipeline.video_io import read_mp4, write_mp4
from hyv_lib.runtimes.vae import decode_latents, to_uint8_frames


def smooth_clip(frames=9, height=96, width=160):
    """A moving colour gradient: content H.264 compresses well, unlike random-weight VAE noise."""
    y, x = np.mgrid[0:height, 0:width]
    clip = [np.stack([(x * 255 // width + 8 * t) % 256, y * 255 // height, np.full_like(x, 64 + 8 * t)], -1)
            for t in range(frames)]
    return np.stack(clip).astype(np.uint8)


def test_mp4_round_trip_keeps_frames_size_and_fps(tmp_path):
    clip = smooth_clip()
    path = str(tmp_path / "clip.mp4")
    write_mp4(clip, path, fps=24)
    video, meta = read_mp4(path)
    assert video.shape == clip.shape and meta["fps"] == 24
    assert np.abs(video.astype(float) - clip.astype(float)).mean() < 3.0
    assert os.listdir(tmp_path) == ["clip.mp4"]  # no temporary file left behind


def test_write_mp4_rejects_wrong_layout(tmp_path):
    with pytest.raises(ValueError, match="uint8"):
        write_mp4(np.zeros((9, 3, 16, 16), np.uint8), str(tmp_path / "x.mp4"), fps=8)
    assert not os.listdir(tmp_path)


def test_uint8_frames_map_the_vae_range_to_bytes_and_reject_other_layouts():
    video = torch.tensor([-2.0, -1.0, 0.0, 1.0, 1.5]).reshape(1, 5, 1, 1).expand(3, 5, 1, 2)  # [3, F, H, W]
    frames = to_uint8_frames(video)
    assert frames.dtype == torch.uint8 and frames.shape == (5, 1, 2, 3)
    assert frames[:, 0, 0, 0].tolist() == [0, 0, 128, 255, 255]  # clamped outside [-1, 1]; 127.5 rounds to even
    assert torch.equal(to_uint8_frames(video.numpy()), frames)
    with pytest.raises(ValueError, match=r"\[3, F, H, W\]"):
        to_uint8_frames(torch.zeros(5, 1, 2, 3))


def test_atomic_path_leaves_nothing_when_the_writer_fails(tmp_path):
    target = tmp_path / "out.safetensors"
    with pytest.raises(RuntimeError):
        with atomic_path(str(target)) as tmp:
            open(tmp, "w").write("half")
            raise RuntimeError("killed mid-write")
    assert not os.listdir(tmp_path)


def test_decode_gives_uint8_frames_and_tiling_is_exact_below_one_tile():
    tiny = get_preset("tiny")
    vae = build_tiny_components(tiny, names=["vae"])["vae"]
    latents = torch.randn(tiny.latent_shape(96, 160, 9), generator=torch.Generator().manual_seed(0))
    tiled = decode_latents(vae, latents, tiling=True)
    plain = decode_latents(vae, latents, tiling=False)
    assert tiled.shape == (9, 96, 160, 3) and tiled.dtype == torch.uint8
    assert torch.equal(tiled, plain)


def test_tiled_decode_matches_one_piece_within_30_db():
    """Stage 3's spatial tiles (256 px, overlap 0.25, linear blending) against one-piece decoding on a frame larger
    than a tile. They differ (each tile's mid-block attention sees only its own tile; seams are blended), but by
    little: measured 34.5 dB PSNR on this random tiny VAE, asserted >= 30 dB."""
    from hyv_lib.tiny import quality

    tiny = get_preset("tiny")
    vae = build_tiny_components(tiny, names=["vae"])["vae"]
    latents = torch.randn(1, tiny.latent_channels, 3, 20, 28, generator=torch.Generator().manual_seed(0))
    tiled = decode_latents(vae, latents, tiling=True).numpy()
    whole = decode_latents(vae, latents, tiling=False).numpy()
    assert tiled.shape == whole.shape == (9, 320, 448, 3)
    assert not np.array_equal(tiled, whole)  # the tiles really were used
    assert quality.psnr(tiled, whole, 255) >= 30.0


def test_write_mp4_refuses_frames_that_are_not_uint8(tmp_path):
    """A float [-1, 1] video cast to uint8 would be an all-black mp4: it is an error naming the argument."""
    from hyv_lib.base.errors import HyvInputError

    with pytest.raises(HyvInputError) as err:
        write_mp4(np.zeros((2, 16, 16, 3), dtype=np.float32), str(tmp_path / "v.mp4"), 8)
    assert err.value.argument == "frames" and "uint8" in str(err.value)
    assert not list(tmp_path.iterdir())  # nothing written


def test_atomic_write_gets_the_umask_permissions_and_leaves_the_umask_alone(tmp_path):
    before = os.umask(0o027)
    try:
        with atomic_path(str(tmp_path / "f.bin")) as tmp:
            with open(tmp, "wb") as f:
                f.write(b"x")
        assert os.umask(0o027) == 0o027  # atomic_path did not change it
        assert (os.stat(tmp_path / "f.bin").st_mode & 0o777) == 0o640  # 0666 minus the umask, as a plain open gives
    finally:
        os.umask(before)


def test_video_html_embeds_a_scaled_copy_of_a_large_file(tmp_path):
    """Pages must stay small: an mp4 over max_bytes is embedded scaled to the display width, not as is."""
    import base64
    import re

    import numpy as np

    from hyv_lib.notebook.display import video_html
    from hyv_lib.pipeline.video_io import read_mp4, write_mp4

    frames = np.random.default_rng(0).integers(0, 256, (5, 256, 448, 3), dtype=np.uint8)  # noise: incompressible
    path = str(tmp_path / "big.mp4")
    write_mp4(frames, path, 8)
    html = video_html(path, width=224, max_bytes=50_000).data
    data = base64.b64decode(re.search(r"base64,([^\"]+)", html).group(1))
    (tmp_path / "small.mp4").write_bytes(data)
    small, _ = read_mp4(str(tmp_path / "small.mp4"))
    assert small.shape == (5, 128, 224, 3) and len(data) < (tmp_path / "big.mp4").stat().st_size / 2
    assert video_html(path, width=224, max_bytes=10**9).data.count("base64,") == 1  # small enough: as is


def test_video_html_with_a_media_dir_links_the_file_by_a_relative_url(tmp_path, monkeypatch):
    """The book's form: the page refers to a copy in the media folder (no bytes in the page), by a URL relative to
    the working folder, so it resolves both in Jupyter and in the built site."""
    import re

    from hyv_lib.notebook.display import video_html

    clip = smooth_clip(frames=5, height=32, width=48)
    (tmp_path / "notebooks").mkdir()
    write_mp4(clip, str(tmp_path / "notebooks" / "clip.mp4"), 8)
    monkeypatch.chdir(tmp_path / "notebooks")
    html = video_html("clip.mp4", media_dir="../_static/videos").data
    url = re.search(r'src="([^"]+)"', html).group(1)
    assert url.startswith("../_static/videos/") and url.endswith(".mp4") and "base64" not in html
    copied, _ = read_mp4(url)
    np.testing.assert_array_equal(copied, read_mp4("clip.mp4")[0])
    assert video_html("clip.mp4", media_dir="../_static/videos").data == html  # same content, same file
    assert os.listdir(tmp_path / "_static" / "videos") == [url.rsplit("/", 1)[1]]


def test_a_bf16_decode_leaves_the_shared_vae_as_it_was(tiny_run, tmp_path):
    """stage 3 with --vae_dtype bf16 decodes in bf16 but hands the VAE back in fp32 on its device: in a prompts file
    the same VAE encodes the next prompt's image, which must not silently turn bf16 (or move to a GPU)."""
    from hyv_lib.pipeline.stages import stage3

    vae = build_tiny_components(get_preset("tiny"), names=["vae"])["vae"]
    seen = []
    decode = vae.decode
    vae.decode = lambda z, *a, **k: (seen.append((z.dtype, next(vae.parameters()).dtype)), decode(z, *a, **k))[1]
    stage3(str(tiny_run), output_video=str(tmp_path / "v.mp4"), vae_dtype="bf16", components={"vae": vae})
    assert seen and set(seen) == {(torch.bfloat16, torch.bfloat16)}  # the decode itself ran in bf16
    assert {p.dtype for p in vae.parameters()} == {torch.float32} and next(vae.parameters()).device.type == "cpu"


def test_an_fp32_gpu_decode_turns_tf32_off_and_restores_the_flags():
    """torch allows TF32 convolutions by default on GPUs: an "exact fp32" decode must not use them. The flags are
    plain settings (no GPU needed to read them); they come back as the caller had them."""
    from hyv_lib.runtimes.vae import exact_fp32

    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    try:
        with exact_fp32(torch.device("cuda"), torch.float32):
            assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.allow_tf32 and torch.backends.cuda.matmul.allow_tf32
        with exact_fp32(torch.device("cuda"), torch.bfloat16):  # a bf16 decode is not "exact": flags untouched
            assert torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
