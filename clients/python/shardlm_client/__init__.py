"""clients/python/shardlm_client - Python client of the shardlm gRPC API (grpcio).
The stubs are generated at build time into the installed package, or on first import from a
checkout (see _stubs.py); Client is the typed wrapper (client.py); pb / pb_grpc are the generated
modules for direct use. Tests: tests/server/test_server.py (the copy that the build installed)."""
from .client import (Chunk, Client, Completion, Embeddings, Generation, Stream, TokenLogprob, ToolCall, TopLogprob, pb,
                     pb_grpc, sampling_params)

__all__ = ["Chunk", "Client", "Completion", "Embeddings", "Generation", "Stream", "TokenLogprob", "ToolCall",
           "TopLogprob", "pb", "pb_grpc", "sampling_params"]
