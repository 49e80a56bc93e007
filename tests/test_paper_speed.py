"""Issue 48 item 6: the fast TruFor path (Noiseprint++ with its batch norms folded and ReLUs in place, channels-last
token grids without copies, 1x1 convolutions as matrix products, the decoders' fuse folded into the scales, fused
attention, bands and worker threads) computes the same numbers as a straightforward one-pass implementation written
here from the same parameters (the SegFormer/CMX forward as published: unfolded batch norms, explicit softmax attention,
the decoder's 4 x embed concatenation, NCHW copies)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from forensicslab.detectors.paper import trufor as T

ARCH = dict(dims=(32, 64, 160, 256), heads=(1, 2, 5, 8), depths=(2, 1, 1, 1), embed=48)


def _grid(x, h, w): return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], h, w).contiguous()
def _tokens(x): return x.flatten(2).transpose(1, 2).contiguous()


def _block(blk, x, h, w):
    a, y = blk.attn, blk.norm1(x)
    b, n, c = y.shape
    d = c // a.heads
    q = a.q(y).view(b, n, a.heads, d).transpose(1, 2)
    src = a.norm(_tokens(a.sr(_grid(y, h, w)))) if a.sr_ratio > 1 else y
    k, v = a.kv(src).view(b, -1, 2, a.heads, d).permute(2, 0, 3, 1, 4)
    att = (q @ k.transpose(-2, -1) * d ** -0.5).softmax(-1)
    x = x + a.proj((att @ v).transpose(1, 2).reshape(b, n, c))
    m = blk.mlp
    y = _tokens(m.dwconv.dwconv(_grid(m.fc1(blk.norm2(x)), h, w)))
    return x + m.fc2(F.gelu(y))


def _stage(enc, pre, i, x):
    pe = getattr(enc, f"{pre}patch_embed{i}")
    x = pe.proj(x)
    h, w = x.shape[2:]
    x = pe.norm(_tokens(x))
    for blk in getattr(enc, f"{pre}block{i}"): x = _block(blk, x, h, w)
    return _grid(getattr(enc, f"{pre}norm{i}")(x), h, w)


def _decoder(dec, feats):
    H, W = feats[0].shape[2:]
    ups = []
    for i, f in enumerate(feats):
        u = _grid(getattr(dec, f"linear_c{i + 1}").proj(_tokens(f)), *f.shape[2:])
        ups.append(u if i == 0 else F.interpolate(u, size=(H, W), mode="bilinear", align_corners=False))
    return dec.linear_pred(dec.linear_fuse(torch.cat(ups[::-1], 1)))   # concatenated coarsest first


def reference_forward(net: T.TruForNet, x: torch.Tensor):
    "TruFor's forward the plain way: no folding, no bands, no threads, no channels-last views."
    noise = net.dncnn(x.contiguous()).repeat(1, 3, 1, 1)
    rgb, enc, feats = (x - net.mean) / net.std, net.backbone, []
    for i in range(4):
        a, e = _stage(enc, "", i + 1, rgb), _stage(enc, "extra_", i + 1, noise)
        rgb, noise = enc.FRMs[i](a, e)
        ffm = enc.FFMs[i]
        t1, t2 = ffm.cross(_tokens(rgb), _tokens(noise))
        feats.append(ffm.channel_emb(_grid(torch.cat([t1, t2], -1), *rgb.shape[2:])))
    out = F.interpolate(_decoder(net.decode_head, feats), size=x.shape[2:], mode="bilinear", align_corners=False)
    conf = F.interpolate(_decoder(net.decode_head_conf, feats), size=x.shape[2:], mode="bilinear", align_corners=False)
    det = net.detection(torch.cat([T._pooled_stats(conf), T._pooled_stats(out[:, 1:2] - out[:, :1], F.logsigmoid(conf))], 1))
    return out, conf, det


def _net(seed=0):
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        net = T.TruForNet(**ARCH).eval()
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():   # batch norms with statistics of their own (fresh ones are the identity, hiding a bad fold)
            for m in net.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.2)
                    m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                    m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.2)
            net.dncnn[-1].weight.mul_(30)   # a residual of the size the trained one has (random weights leave it ~1e-3)
    return net


def _diff(a, b): return max(float((u - v).abs().max()) for u, v in zip(a, b))


@pytest.mark.parametrize("threads,band_rows,ffn_band", [(1, None, None), (2, None, None), (2, 24, 100_000)])
def test_trufor_fast_path_equals_reference(monkeypatch, threads, band_rows, ffn_band):
    """Fast and plain forward within 1e-5 on a small image: whole image, two workers, and bands (Noiseprint++, decoders,
    the Mix-FFNs of stages 1 and 2 in bands of 3 rows, the last one shorter, and the attention of stages 1-3 in bands of
    queries: 10,000 numbers make bands of 78, 39 and 15 queries)."""
    monkeypatch.setenv("FORENSICSLAB_TRUFOR_THREADS", str(threads))
    if ffn_band: monkeypatch.setattr(T, "FFN_BAND_ELEMS", ffn_band)
    if ffn_band: monkeypatch.setattr(T, "TOKEN_BAND_ELEMS", 10_000)
    net = _net()
    x = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (1, 3, 136, 200)).astype(np.float32)) / 256
    if band_rows: monkeypatch.setattr(net, "band_pixels", band_rows * 200)
    with torch.inference_mode():
        ref, fast = reference_forward(net, x), net(x)
        assert _diff(ref, fast) <= 1e-5, _diff(ref, fast)
        assert float(ref[0].abs().max()) > 0.1 and float(ref[2].abs().max()) > 1e-3   # not a trivial output
        noise = net.dncnn(x)
        assert float(noise.std()) > 0.02 and float((net.noiseprint_fn()(x) - noise).abs().max()) <= 1e-5
        # the check is sharp: one level of Noiseprint++ whose batch norm the fold forgot is seen
        steps = net._noise_folded[1]
        saved, conv = steps[5], net.dncnn[2 + 3 * 4]
        assert saved[0].shape == conv.weight.shape
        steps[5] = (conv.weight, torch.zeros(conv.out_channels), saved[2], saved[3])
        assert _diff(ref, net(x)) > 1e-5   # the bound above would fail
        assert float((net.noiseprint_fn()(x) - net.dncnn(x)).abs().max()) > 1e-3
        steps[5] = saved
        assert _diff(ref, net(x)) <= 1e-5


def test_trufor_folds_follow_new_weights():
    "Loading other weights (batch-norm statistics included) refreshes the folded Noiseprint++ and decoders."
    net, other = _net(0), _net(7)
    x = torch.rand(1, 3, 72, 96)
    with torch.inference_mode(): net(x)                  # folds made
    net.load_state_dict(other.state_dict())
    with torch.inference_mode(): assert _diff(reference_forward(other, x), net(x)) <= 1e-5


def test_trufor_training_mode_uses_the_plain_module():
    net = _net()
    assert net.noiseprint_fn() is not net.dncnn
    net.train()
    assert net.noiseprint_fn() is net.dncnn
