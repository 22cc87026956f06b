"""The engine: requests in, tokens out, one speculative decoding loop for `generate`, `bench` and `serve`."""
