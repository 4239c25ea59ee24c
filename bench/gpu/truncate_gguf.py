"""Writes a GGUF holding only the first N transformer blocks of another (every other tensor and
all metadata kept, block_count set to N): real weights, real shapes, a file small enough to travel
to the GPU machine (its working tree is limited to 64 MiB). Needs the gguf package.
    python bench/gpu/truncate_gguf.py IN.gguf N OUT.gguf"""
import sys
import gguf

src, n, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
r = gguf.GGUFReader(src)
arch = r.fields[gguf.Keys.General.ARCHITECTURE].contents()
w = gguf.GGUFWriter(dst, arch)
count_key = f"{arch}.block_count"
for f in r.fields.values():
    if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
        continue
    t = f.types[0]
    sub = f.types[-1] if t == gguf.GGUFValueType.ARRAY else None
    v = n if f.name == count_key else f.contents()
    w.add_key_value(f.name, v, t, sub_type=sub)
keep = [t for t in r.tensors
        if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < n]
for t in keep:
    w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()
for t in keep:
    w.write_tensor_data(t.data, tensor_endianess=r.endianess)
w.close()
