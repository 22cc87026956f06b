"""Models and their files: the transformer and its KV cache (model), its configuration (config) and rotary tables
(rope), tokenizers (tokenizer), the bundled pair (bundled), reading GGUF and Hugging Face files (their configs:
gguf_config, hf_config; their tensors: gguf_source, hf_source), the weight
forms a model runs on (weights: PyTorch's int4/int8 kernels, quantize; gguf_native: the native kernels), the
draft's restricted head (draft_head), the cache of converted files (converted), and loading a target and its
draft (loading)."""
