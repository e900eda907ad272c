#!/usr/bin/env python3
"""The CPU mirror of kernels/cuda/attention_train_tc.cu (training attention on tensor cores): its
tile loops, per-row bounds and masks (packed documents, causal, windows, soft-capping, sinks,
bidirectional forward), its two-pass forward and its dq and dk/dv loops, in NumPy with f32 sums,
against a dense float64 reference. With P and dS kept in f32 the mirror must match the reference
to f32 rounding (1e-4 of the largest value): that checks the kernels' index and mask logic. With them rounded to
bf16 before the second products, as the kernels do, within 3 bf16 units of the largest value. The
kernels themselves run only on a GPU (tests/test_attention_train.c --backend cuda with
SHARDLM_CUDA_TRAIN_ATTENTION=tc, tools/gpu_check.sh).

  python3 test_attention_tc_mirror.py        (numpy only; SKIP 77 without it)
"""
import sys
try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is not installed")
    sys.exit(77)
ROUND = [True]
T = 64
def bf16(x):
    x = np.asarray(x, np.float32)
    if not ROUND[0]:
        return x
    b = x.view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32)
def doc_of(ds, i):
    return max(d for d in range(len(ds) - 1) if ds[d] <= i)
def first_key(ds, i, w):
    b = ds[doc_of(ds, i)]
    return i - w + 1 if w > 0 and i - w + 1 > b else b
def key_end(ds, j, w):
    e = ds[doc_of(ds, j) + 1]
    return j + w if w > 0 and j + w < e else e
def cap(s, c): return c * np.tanh(s / c) if c > 0 else s
def capg(z, c): return 1 - (z / c) ** 2 if c > 0 else np.ones_like(z)
def tile(x, a, cnt):
    out = np.zeros((T, x.shape[1]), np.float32); cnt = max(0, min(cnt, T))
    out[:cnt] = x[a:a + cnt]; return out
def forward(q, k, v, ds, w, sc, c, bidir, sink):
    n = q.shape[0]; out = np.zeros_like(q); lse = np.zeros(n, np.float32)
    for r0 in range(0, n, T):
        r1 = min(r0 + T, n)
        rows = np.arange(r0, r0 + T); live = rows < r1
        lo = np.array([first_key(ds, i, w) if i < r1 else 0 for i in rows])
        hi = np.array([(key_end(ds, i, 0) if bidir else i + 1) if i < r1 else 0 for i in rows])
        kbeg = first_key(ds, r0, w); kend = key_end(ds, r1 - 1, 0) if bidir else r1
        Q = tile(q, r0, r1 - r0)
        m = np.full(T, sink if sink is not None else -np.inf, np.float32); l = np.full(T, 1.0 if sink is not None else 0.0, np.float32)
        for k0 in range(kbeg, kend, T):
            S = Q @ tile(k, k0, kend - k0).T
            keys = k0 + np.arange(T)
            valid = live[:, None] & (keys[None] >= lo[:, None]) & (keys[None] < hi[:, None])
            z = np.where(valid, cap(S * sc, c), -np.inf)
            mx = z.max(1); anyv = mx != -np.inf
            mn = np.where(anyv & (mx > m), mx, m)
            with np.errstate(invalid="ignore"):
                s = np.where(valid, np.exp(z - mn[:, None]), 0).sum(1)
                l = np.where(anyv, l * np.exp(m - mn) + s, l); m = np.where(anyv, mn, m)
        with np.errstate(divide="ignore"):
            L = m + np.log(l)
        acc = np.zeros((T, q.shape[1]), np.float32)
        for k0 in range(kbeg, kend, T):
            S = Q @ tile(k, k0, kend - k0).T
            keys = k0 + np.arange(T)
            valid = live[:, None] & (keys[None] >= lo[:, None]) & (keys[None] < hi[:, None])
            with np.errstate(invalid="ignore", over="ignore"):
                P = np.where(valid, np.exp(cap(S * sc, c) - L[:, None]), 0)
            acc += bf16(P) @ tile(v, k0, kend - k0)
        out[r0:r1] = acc[:r1 - r0]; lse[r0:r1] = L[:r1 - r0]
    return out, lse
def backward(q, k, v, dout, out, lse, ds, w, sc, c):
    n = q.shape[0]; D = (dout * out).sum(1)
    dq = np.zeros_like(q); dk = np.zeros_like(k); dv = np.zeros_like(v)
    for r0 in range(0, n, T):
        r1 = min(r0 + T, n); rows = np.arange(r0, r0 + T); live = rows < r1
        lo = np.array([first_key(ds, i, w) if i < r1 else 0 for i in rows])
        Lr = np.array([lse[i] if i < r1 else 0 for i in rows]); Dr = np.array([D[i] if i < r1 else 0 for i in rows])
        Q = tile(q, r0, r1 - r0); dO = tile(dout, r0, r1 - r0); acc = np.zeros_like(Q)
        for k0 in range(first_key(ds, r0, w), r1, T):
            K = tile(k, k0, r1 - k0); V = tile(v, k0, r1 - k0)
            S = Q @ K.T; dP = dO @ V.T; keys = k0 + np.arange(T)
            valid = live[:, None] & (keys[None] >= lo[:, None]) & (keys[None] <= rows[:, None])
            z = cap(S * sc, c); P = np.exp(z - Lr[:, None])
            dS = np.where(valid, P * (dP - Dr[:, None]) * capg(z, c) * sc, 0)
            acc += bf16(dS) @ K
        dq[r0:r1] = acc[:r1 - r0]
    for j0 in range(0, n, T):
        j1 = min(j0 + T, n); keys = j0 + np.arange(T)
        K = tile(k, j0, j1 - j0); V = tile(v, j0, j1 - j0)
        qend = key_end(ds, j1 - 1, w); aK = np.zeros_like(K); aV = np.zeros_like(V)
        for q0 in range(j0, qend, T):
            Q = tile(q, q0, qend - q0); dO = tile(dout, q0, qend - q0); qs = q0 + np.arange(T)
            qlo = np.array([first_key(ds, i, w) if i < qend else 1 << 60 for i in qs])
            qL = np.array([lse[i] if i < qend else 0 for i in qs]); qD = np.array([D[i] if i < qend else 0 for i in qs])
            St = K @ Q.T; dPt = V @ dO.T
            valid = (keys[:, None] < j1) & (qlo[None] <= keys[:, None]) & (keys[:, None] <= qs[None])
            z = cap(St * sc, c)
            with np.errstate(over="ignore"):
                P = np.where(valid, np.exp(z - qL[None]), 0)
            dS = np.where(valid, P * (dPt - qD[None]) * capg(z, c) * sc, 0)
            aV += bf16(P) @ dO; aK += bf16(dS) @ Q
        dk[j0:j1] = aK[:j1 - j0]; dv[j0:j1] = aV[:j1 - j0]
    return dq, dk, dv
def dense(q, k, v, dout, ds, w, sc, c, bidir, sink):
    n = q.shape[0]; q = q.astype(np.float64); k = k.astype(np.float64); v = v.astype(np.float64)
    mask = np.zeros((n, n), bool)
    for i in range(n):
        hi = key_end(ds, i, 0) if bidir else i + 1
        mask[i, first_key(ds, i, w):hi] = True
    z = cap(q @ k.T * sc, c); zm = np.where(mask, z, -np.inf)
    mx = zm.max(1, keepdims=True)
    if sink is not None: mx = np.maximum(mx, sink)
    e = np.where(mask, np.exp(zm - mx), 0); den = e.sum(1, keepdims=True) + (np.exp(sink - mx) if sink is not None else 0)
    P = e / den; lse = (mx + np.log(den))[:, 0]; out = P @ v
    dP = dout @ v.T; Dd = (dout * out).sum(1, keepdims=True); dS = P * (dP - Dd) * capg(z, c) * sc
    return out, lse, dS @ k, dS.T @ q, P.T @ dout
def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 0.1))  # 0.1: where the exact value is 0 (window 1)


def main():
    rng = np.random.default_rng(1)
    fails = 0
    cases = [(300, [0, 300], 0, 0, 0, None), (190, [0, 17, 18, 120, 190], 0, 0, 0, None),
             (200, [0, 129, 200], 64, 0, 0, None), (170, [0, 150, 170], 16, 0, 0, 0.7),
             (140, [0, 9, 130, 140], 0, 0, 1, None), (150, [0, 80, 150], 0, 20.0, 0, None),
             (65, [0, 65], 7, 0, 0, None), (64, [0, 0, 64], 0, 0, 0, None), (129, [0, 1, 129], 1, 0, 0, None)]
    for (n, docs, w, c, bidir, sink) in cases:
        d, sc = 64, 1 / 8
        q, k, v, dout = (bf16(rng.normal(size=(n, d))) for _ in range(4))
        ro, rl, rdq, rdk, rdv = dense(q, k, v, dout, docs, w, sc, c, bidir, sink)
        for rounded, bound in ((False, 1e-4), (True, 3 * 2.0 ** -8)):
            ROUND[0] = rounded
            o, l = forward(q, k, v, docs, w, sc, c, bidir, sink)
            errs = {"out": rel(o, ro), "lse": rel(l, rl)}
            if not bidir:  # the backward is not built for an encoder's attention
                dq, dk, dv = backward(q, k, v, dout, o, l, docs, w, sc, c)
                errs.update(dq=rel(dq, rdq), dk=rel(dk, rdk), dv=rel(dv, rdv))
            ok = max(errs.values()) <= bound
            fails += not ok
            print("%s: n %d documents %s window %d softcap %g%s%s, P and dS %s: %s (bound %.1e)" % (
                "PASS" if ok else "FAIL", n, docs, w, c, " bidirectional" if bidir else "",
                " sink %g" % sink if sink is not None else "", "in bf16" if rounded else "in f32",
                ", ".join("%s %.1e" % kv for kv in errs.items()), bound))
    print("%d failed" % fails)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
