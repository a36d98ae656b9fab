"""Writes the gguf-py seed files of the gguf_parse fuzz target (PyPI gguf 0.19.0, numpy)."""
import gguf
import numpy as np


def write(name, fill):
    w = gguf.GGUFWriter(name, "seed")
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def scalars(w):
    w.add_uint32("seed.u32", 7)
    w.add_int8("seed.i8", -3)
    w.add_float64("seed.f64", 0.5)
    w.add_bool("seed.b", True)
    w.add_string("seed.s", "héllo")
    w.add_array("seed.arr", [1, 2, 3])
    w.add_array("seed.sarr", ["a", "bc"])
    w.add_tensor("t0", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.add_tensor("t1", np.ones((3,), dtype=np.float16))


def quantized(w):
    w.add_uint64("seed.u64", 1 << 40)
    w.add_int16("seed.i16", -1)
    w.add_tensor("q", np.zeros((2, 84), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q2_K)
    w.add_tensor("q8", np.zeros((1, 68), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)


def nested(w):
    w.add_array("seed.nested", [[1, 2], [3]])


write("gguf-py-scalars-f32-f16.gguf", scalars)
write("gguf-py-q2k-q8_0.gguf", quantized)
write("gguf-py-nested-array.gguf", nested)
