#!/usr/bin/python3
"""An independent safetensors reader, written from the format's specification
(github.com/huggingface/safetensors, README "Format"), not from mt's code, for the export tests.

  safetensors_reader.py check FILE
      parses FILE: 8 bytes little-endian unsigned header size N; N bytes of UTF-8 JSON (an object;
      optional "__metadata__" of strings; per tensor "dtype", "shape", "data_offsets" [begin, end)
      relative to the byte buffer after the header); the buffer is covered by the tensors back to
      back, each end - begin = prod(shape) * size(dtype), and the file ends with it. Prints one
      JSON line: header_size, buffer_bytes, metadata, tensors {name: {dtype, shape}}.
  safetensors_reader.py compare FILE CHECKPOINT
      also decodes every tensor's bytes (little-endian F32/F16/BF16) and compares them with the mt
      checkpoint's parameters read with h5py, through the name and layout mapping transformers
      expects (written out here independently of mt's): GPT2LMHeadModel (Conv1D weights stored
      transposed, q/k/v fused into attn.c_attn) or LlamaForCausalLM, vocabulary pad rows dropped,
      lm_head only when untied. Values must be equal bit for bit (an F32 export) or to the
      checkpoint's values rounded as the dtype rounds them. Exit 1 with one line on any mismatch.
Used by tests/tools/mt-ckpt.bats; `compare` needs Debian's python3-h5py and python3-numpy.
"""
import json
import struct
import sys

DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def fail(message):
    sys.stderr.write("safetensors_reader: " + message + "\n")
    sys.exit(1)


def parse(path):
    """(header dict without __metadata__, metadata, header size, buffer bytes) after checking the spec."""
    with open(path, "rb") as handle:
        data = handle.read()
    if len(data) < 8:
        fail("%s: shorter than 8 bytes" % path)
    (size,) = struct.unpack("<Q", data[:8])
    if 8 + size > len(data):
        fail("%s: header size %d past the end of the file" % (path, size))
    text = data[8:8 + size].decode("utf-8")
    if not text.startswith("{"):
        fail("%s: header does not start with '{'" % path)
    header = json.loads(text)  # trailing spaces are allowed padding
    metadata = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        fail("%s: __metadata__ must map strings to strings" % path)
    buffer = data[8 + size:]
    spans = []
    for name, entry in header.items():
        if set(entry) != {"dtype", "shape", "data_offsets"}:
            fail("%s: %s has keys %s" % (path, name, sorted(entry)))
        if entry["dtype"] not in DTYPE_BYTES:
            fail("%s: %s has unknown dtype %r" % (path, name, entry["dtype"]))
        count = 1
        for dim in entry["shape"]:
            if not isinstance(dim, int) or dim < 0:
                fail("%s: %s has shape %r" % (path, name, entry["shape"]))
            count *= dim
        begin, end = entry["data_offsets"]
        if end - begin != count * DTYPE_BYTES[entry["dtype"]]:
            fail("%s: %s spans %d bytes for %d elements of %s" % (path, name, end - begin, count, entry["dtype"]))
        spans.append((begin, end, name))
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            fail("%s: %s starts at %d, expected %d" % (path, name, begin, position))
        position = end
    if position != len(buffer):
        fail("%s: tensors cover %d of the %d buffer bytes" % (path, position, len(buffer)))
    return header, metadata, size, buffer


def decode(entry, buffer):
    """The tensor's values as float32 numpy array of its shape."""
    import numpy as np
    begin, end = entry["data_offsets"]
    raw = buffer[begin:end]
    if entry["dtype"] == "F32":
        values = np.frombuffer(raw, dtype="<f4")
    elif entry["dtype"] == "F16":
        values = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif entry["dtype"] == "BF16":
        values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        fail("dtype %s is not a float mt exports" % entry["dtype"])
    return values.reshape(entry["shape"])


def expected_tensors(checkpoint):
    """{HF name: float32 array} from the mt checkpoint, by transformers' conventions."""
    import h5py
    import numpy as np
    with h5py.File(checkpoint, "r") as f:
        config = json.loads(f.attrs["model_config"])
        model = {name: f["model"][name][()].astype(np.float32) for name in f["model"]}
    vocab = config["vocab_size"]
    layers = config["num_layers"]
    tied = not config["untie_embeddings_and_output_weights"]
    out = {}
    if config["normalization"] == "LayerNorm":
        out["transformer.wte.weight"] = model["embedding.word_embeddings.weight"][:vocab]
        out["transformer.wpe.weight"] = model["embedding.position_embeddings.weight"]
        for i in range(layers):
            m = lambda name: model["decoder.layers.%d.%s" % (i, name)]  # noqa: E731
            h = "transformer.h.%d." % i
            for kind in ("weight", "bias"):
                qkv = np.concatenate([m("self_attention.linear_%s.%s" % (p, kind)) for p in "qkv"], axis=0)
                out[h + "ln_1." + kind] = m("input_layernorm." + kind)
                out[h + "attn.c_attn." + kind] = qkv.T if kind == "weight" else qkv
                out[h + "attn.c_proj." + kind] = m("self_attention.linear_proj." + kind).T
                out[h + "ln_2." + kind] = m("pre_mlp_layernorm." + kind)
                out[h + "mlp.c_fc." + kind] = m("mlp.linear_fc1." + kind).T
                out[h + "mlp.c_proj." + kind] = m("mlp.linear_fc2." + kind).T
        out["transformer.ln_f.weight"] = model["decoder.final_layernorm.weight"]
        out["transformer.ln_f.bias"] = model["decoder.final_layernorm.bias"]
    else:
        out["model.embed_tokens.weight"] = model["embedding.word_embeddings.weight"][:vocab]
        for i in range(layers):
            m = lambda name: model["decoder.layers.%d.%s" % (i, name)]  # noqa: E731
            h = "model.layers.%d." % i
            out[h + "input_layernorm.weight"] = m("input_layernorm.weight")
            for hf, mt in (("q_proj", "linear_q"), ("k_proj", "linear_k"), ("v_proj", "linear_v"), ("o_proj", "linear_proj")):
                out[h + "self_attn.%s.weight" % hf] = m("self_attention.%s.weight" % mt)
            out[h + "post_attention_layernorm.weight"] = m("pre_mlp_layernorm.weight")
            if config.get("num_experts", 0) > 0:  # MixtralForCausalLM: expert(x) = w2(silu(w1 x) * w3 x)
                out[h + "block_sparse_moe.gate.weight"] = m("mlp.router.weight")
                for e in range(config["num_experts"]):
                    x = h + "block_sparse_moe.experts.%d." % e
                    out[x + "w1.weight"] = m("mlp.experts.%d.linear_fc1_gate.weight" % e)
                    out[x + "w3.weight"] = m("mlp.experts.%d.linear_fc1_up.weight" % e)
                    out[x + "w2.weight"] = m("mlp.experts.%d.linear_fc2.weight" % e)
                continue
            out[h + "mlp.gate_proj.weight"] = m("mlp.linear_fc1_gate.weight")
            out[h + "mlp.up_proj.weight"] = m("mlp.linear_fc1_up.weight")
            out[h + "mlp.down_proj.weight"] = m("mlp.linear_fc2.weight")
        out["model.norm.weight"] = model["decoder.final_layernorm.weight"]
    if not tied:
        out["lm_head.weight"] = model["output_layer.weight"][:vocab]
    return out


def rounded(values, dtype):
    """float32 values rounded to nearest even as `dtype` stores them, back as float32."""
    import numpy as np
    if dtype == "F32":
        return values
    if dtype == "F16":
        return values.astype(np.float16).astype(np.float32)
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        header, metadata, size, buffer = parse(sys.argv[2])
        print(json.dumps({"header_size": size, "buffer_bytes": len(buffer), "metadata": metadata,
                          "tensors": {name: {"dtype": e["dtype"], "shape": e["shape"]} for name, e in header.items()}}))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        import numpy as np
        header, _, _, buffer = parse(sys.argv[2])
        expected = expected_tensors(sys.argv[3])
        if set(header) != set(expected):
            fail("names differ: only in the file %s, only expected %s" % (sorted(set(header) - set(expected)),
                                                                         sorted(set(expected) - set(header))))
        for name, entry in header.items():
            values = decode(entry, buffer)
            want = rounded(expected[name], entry["dtype"])
            if values.shape != want.shape:
                fail("%s: shape %s, expected %s" % (name, values.shape, want.shape))
            if not np.array_equal(values.view(np.uint32), np.ascontiguousarray(want).view(np.uint32)):
                fail("%s: values differ (max abs %g)" % (name, np.abs(values - want).max()))
        print(json.dumps({"compared": len(header)}))
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
