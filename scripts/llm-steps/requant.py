# Writes a copy of a GGUF whose Q6_K tensors (or, with a third argument `all`, its Q4_K
# tensors too) are dequantized and quantized again as Q8_0, for steps.cpp to compare how the
# engine's kernels scale with the sequences a step carries. A measuring aid only: the service
# runs the model as fetched. Needs numpy.
#   python3 requant.py IN.gguf OUT.gguf [all]
import struct, sys, numpy as np
src, dst = sys.argv[1], sys.argv[2]
buf = memoryview(open(src,'rb').read())
pos = 0
def rd(fmt):
    global pos
    v = struct.unpack_from('<'+fmt, buf, pos); pos += struct.calcsize('<'+fmt); return v
assert buf[0:4].tobytes() == b'GGUF'
ver = rd('4xI')[0]
nt, nkv = rd('QQ')
kv_start = pos
sizes={0:1,1:1,2:2,3:2,4:4,5:4,6:4,7:1,10:8,11:8,12:8}
def skip_val(t):
    global pos
    if t == 8: n = rd('Q')[0]; pos += n
    elif t == 9:
        at, n = rd('IQ')
        for _ in range(n): skip_val(at)
    else: pos += sizes[t]
align = 32
for _ in range(nkv):
    n = rd('Q')[0]; k = buf[pos:pos+n].tobytes().decode(); pos += n
    t = rd('I')[0]
    if k == 'general.alignment': align = struct.unpack_from('<I', buf, pos)[0]
    skip_val(t)
kv_bytes = buf[kv_start:pos].tobytes()
tensors = []
for _ in range(nt):
    n = rd('Q')[0]; name = buf[pos:pos+n].tobytes(); pos += n
    nd = rd('I')[0]; dims = rd('Q'*nd); t, off = rd('IQ')
    tensors.append([name, dims, t, off])
data_start = (pos + align - 1) // align * align
BS = {0: None, 12: (256, 144), 14: (256, 210), 8: (32, 34)}
def nbytes(dims, t):
    ne = int(np.prod(dims))
    if t == 0: return ne * 4
    if t not in BS: sys.exit(f'tensor type {t} is not handled')
    b, s = BS[t]; return ne // b * s
def q6k_deq(raw):
    b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 210)
    ql = b[:, :128].astype(np.int16); qh = b[:, 128:192].astype(np.int16)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = b[:, 208:210].copy().view(np.float16).astype(np.float32)[:, 0]
    y = np.empty((b.shape[0], 256), np.float32)
    for h in range(2):
        L = ql[:, 64*h:64*h+64]; H = qh[:, 32*h:32*h+32]; S = sc[:, 8*h:8*h+8]
        q1 = (L[:, :32] & 15) | (((H >> 0) & 3) << 4)
        q2 = (L[:, 32:] & 15) | (((H >> 2) & 3) << 4)
        q3 = (L[:, :32] >> 4) | (((H >> 4) & 3) << 4)
        q4 = (L[:, 32:] >> 4) | (((H >> 6) & 3) << 4)
        for j, q in enumerate((q1, q2, q3, q4)):
            q = (q - 32).astype(np.float32)
            # Each 16 values of the 32 have a scale of their own.
            s = np.repeat(S[:, [2*j, 2*j+1]], 16, axis=1)
            y[:, 128*h + 32*j: 128*h + 32*j + 32] = d[:, None] * s * q
    return y.reshape(-1)
CONVERT = {12, 14} if sys.argv[3:] == ['all'] else {14}
def q4k_deq(raw):
    b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 144)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
    dm = b[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
    q = b[:, 4:16].astype(np.int32); qs = b[:, 16:144]
    sc = np.empty((b.shape[0], 8), np.float32); mn = np.empty((b.shape[0], 8), np.float32)
    for j in range(8):
        if j < 4: sc[:, j] = q[:, j] & 63; mn[:, j] = q[:, j+4] & 63
        else:
            sc[:, j] = (q[:, j+4] & 15) | ((q[:, j-4] >> 6) << 4)
            mn[:, j] = (q[:, j+4] >> 4) | ((q[:, j] >> 6) << 4)
    y = np.empty((b.shape[0], 256), np.float32)
    for c in range(4):
        Q = qs[:, 32*c:32*c+32]
        y[:, 64*c:64*c+32] = (d*sc[:, 2*c])[:, None] * (Q & 15) - (dm*mn[:, 2*c])[:, None]
        y[:, 64*c+32:64*c+64] = (d*sc[:, 2*c+1])[:, None] * (Q >> 4) - (dm*mn[:, 2*c+1])[:, None]
    return y.reshape(-1)
def q8_0(x):
    x = x.reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = amax / 127.0
    idv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0)
    # roundf: halves away from zero, as ggml rounds.
    q = (np.sign(x * idv[:, None]) * np.floor(np.abs(x * idv[:, None]) + 0.5)).astype(np.int8)
    out = np.empty((x.shape[0], 34), np.uint8)
    out[:, :2] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()
blobs = []; off = 0
for t in tensors:
    name, dims, ty, o = t
    raw = buf[data_start + o: data_start + o + nbytes(dims, ty)]
    if ty in CONVERT:
        out = bytearray()
        bs = BS[ty][1]; step = bs * 4096
        deq = q6k_deq if ty == 14 else q4k_deq
        for i in range(0, len(raw), step):
            out += q8_0(deq(raw[i:i+step].tobytes()))
        raw = bytes(out); t[2] = 8
        print(ty, '-> q8_0', name.decode(), dims, file=sys.stderr)
    t[3] = off; blobs.append(raw)
    off += len(raw); off = (off + align - 1) // align * align
with open(dst, 'wb') as o:
    o.write(b'GGUF'); o.write(struct.pack('<IQQ', ver, nt, nkv)); o.write(kv_bytes)
    for name, dims, ty, of in tensors:
        o.write(struct.pack('<Q', len(name))); o.write(name); o.write(struct.pack('<I', len(dims)))
        o.write(struct.pack('<'+'Q'*len(dims), *dims)); o.write(struct.pack('<IQ', ty, of))
    p = o.tell(); o.write(b'\0' * ((p + align - 1)//align*align - p))
    base = o.tell()
    for (name, dims, ty, of), b in zip(tensors, blobs):
        p = o.tell() - base; o.write(b'\0' * (of - p)); o.write(b)
